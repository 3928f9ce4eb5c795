// quantize_{KIND}: a matmul's activations quantized once per product with the CPU backend's
// rounding (formats/q8_0.rs, q8_1.rs, k_quants/q8_k.rs, the oracle), so the quants are the
// CPU's bit for bit. One invocation per block, which scans it in order as the CPU does.
// A receives the quants (4 per word), from d_off each block's scale as the CPU stores it
// (f16-rounded for Q8_0/Q8_1, f32 for Q8_K), from s_off Q8_1's f16(d·Σq) or Q8_K's sums of
// 16 quants.
struct Params {
    n_blocks: u32,
    d_off: u32,
    s_off: u32,
    x_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> A: array<u32>;

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
fn quantize_32(blk: u32, with_s: bool) {
    let x0 = P.x_off + blk * 32u;
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(X[x0 + i]));
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
            let qi = round_away(X[x0 + 4u * w + k] * id);
            sum += qi;
            word |= (bitcast<u32>(qi) & 0xffu) << (8u * k);
        }
        A[blk * 8u + w] = word;
    }
    A[P.d_off + blk] = bitcast<u32>(round_f16(dd));
    if (with_s) {
        A[P.s_off + blk] = bitcast<u32>(round_f16(f32(sum) * dd));
    }
}

// Q8_K (256 elements): `max` is the first element of largest magnitude, with its sign;
// iscale = −127 / max, q = min(127, round-to-nearest-even(iscale · x)), d = 1 / iscale
// (f32). An all-zero block gets d = 0, q = 0.
fn quantize_256(blk: u32) {
    let x0 = P.x_off + blk * 256u;
    var amax = 0.0;
    var mx = 0.0;
    for (var i = 0u; i < 256u; i++) {
        let v = X[x0 + i];
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
                let qi = min(127, i32(round(iscale * X[x0 + 16u * g + 4u * w + k])));
                sum += qi;
                word |= (bitcast<u32>(qi) & 0xffu) << (8u * k);
            }
            A[blk * 64u + 4u * g + w] = word;
        }
        A[P.s_off + blk * 16u + g] = bitcast<u32>(sum);
    }
    A[P.d_off + blk] = bitcast<u32>(1.0 / iscale);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let blk = flat_id(wid, nwg, lid, 64u);
    if (blk >= P.n_blocks) {
        return;
    }
    {BODY}
}
