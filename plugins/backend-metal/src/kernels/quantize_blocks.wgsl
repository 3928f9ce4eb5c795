// The activation quantizers, one block per call, with the CPU backend's rounding
// (formats/q8_0.rs, q8_1.rs, k_quants/q8_k.rs, the oracle), so the quants are the CPU's bit
// for bit; each scans its block in order as the CPU does. The including kernel defines
// `qin(i)`, the value of element i (an activation, or one computed on the way: a norm's
// output, SwiGLU's), and `P.d_off`, `P.s_off`; A receives the quants (4 per word), from
// d_off each block's scale as the CPU stores it (f16-rounded for Q8_0/Q8_1, f32 for Q8_K),
// from s_off Q8_1's f16(d·Σq) or Q8_K's sums of 16 quants.

// Round half away from zero (C's roundf); WGSL's round() ties to even.
fn round_away(x: f32) -> i32 {
    let r = trunc(x);
    if (abs(x - r) >= 0.5) {
        return i32(r + sign(x));
    }
    return i32(r);
}

// Q8_0 / Q8_1 (32 elements): d = max|x| / 127, q = round(x / d) half away from zero; `s`
// (Q8_1) is d · Σq. d and s are kept rounded to f16, as the CPU's blocks store them.
fn quantize_32(blk: u32, x0: u32, with_s: bool) {
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(qin(x0 + i)));
    }
    let dd = amax / 127.0;
    var id = 0.0;
    if (dd != 0.0) {
        id = 1.0 / dd;
    }
    var sum = 0;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let qi = round_away(qin(x0 + 4u * w + k) * id);
            sum += qi;
            word |= (bitcast<u32>(qi) & 0xffu) << (8u * k);
        }
        A[blk * 8u + w] = word;
        if (with_s) {
            // Q8_1's pair words (after the sums, which end at 2·s_off − d_off).
            let p = 2u * P.s_off - P.d_off + blk * 16u + (w / 4u) * 8u + (w & 3u);
            A[p] = pair_ev(word);
            A[p + 4u] = pair_od(word);
        }
    }
    A[P.d_off + blk] = bitcast<u32>(round_f16(dd));
    if (with_s) {
        A[P.s_off + blk] = bitcast<u32>(round_f16(f32(sum) * dd));
    }
}

// A quant word's pairs for the Q4_1 texel kernel (formats_legacy.wgsl's `swar_q4_1`): for
// quants a0 … a3 (signed bytes), a2 + a0·2^16 and a3 + a1·2^16, mod 2^32. Q8_1
// activations carry them, 16 words a block (elements 0–15's 4 `ev` then 4 `od` words, then
// elements 16–31's), so that the kernel reads rather than builds them.
fn pair_ev(u: u32) -> u32 {
    let s = bitcast<i32>(u);
    return bitcast<u32>(((s << 8u) >> 24u) + ((s << 24u) >> 8u));
}

fn pair_od(u: u32) -> u32 {
    let s = bitcast<i32>(u);
    return bitcast<u32>((s >> 24u) + (((s << 16u) >> 8u) & -65536));
}

// Q8_K (256 elements): `max` is the first element of largest magnitude, with its sign;
// iscale = −127 / max, q = min(127, round-to-nearest-even(iscale · x)), d = 1 / iscale
// (f32). An all-zero block gets d = 0, q = 0.
fn quantize_256(blk: u32, x0: u32) {
    var amax = 0.0;
    var mx = 0.0;
    for (var i = 0u; i < 256u; i++) {
        let v = qin(x0 + i);
        if (abs(v) > amax) {
            amax = abs(v);
            mx = v;
        }
    }
    if (amax == 0.0) {
        for (var w = 0u; w < 64u; w++) {
            A[blk * 64u + w] = 0u;
        }
        for (var g = 0u; g < 16u; g++) {
            A[P.s_off + blk * 16u + g] = 0u;
        }
        A[P.d_off + blk] = 0u;
        return;
    }
    let iscale = -127.0 / mx;
    for (var g = 0u; g < 16u; g++) {
        var sum = 0;
        for (var w = 0u; w < 4u; w++) {
            var word = 0u;
            for (var k = 0u; k < 4u; k++) {
                let qi = min(127, i32(round(iscale * qin(x0 + 16u * g + 4u * w + k))));
                sum += qi;
                word |= (bitcast<u32>(qi) & 0xffu) << (8u * k);
            }
            A[blk * 64u + 4u * g + w] = word;
        }
        A[P.s_off + blk * 16u + g] = bitcast<u32>(sum);
    }
    A[P.d_off + blk] = bitcast<u32>(1.0 / iscale);
}

