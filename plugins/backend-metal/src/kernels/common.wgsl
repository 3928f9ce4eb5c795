// Shared by every kernel: f16/bf16 conversions with the CPU backend's rounding, the CPU's
// own e^x, packed-byte helpers and the linear index of a 2-D dispatch. Pure functions, no
// bindings. Values are never fused by intent (a product, then a sum), as on the CPU, except
// F32 weights' dot terms (`fma`, formats_float.wgsl), which the CPU fuses too; WGSL cannot
// forbid the driver from contracting the others (see the crate docs for what was measured).

// f32 → f16 bits, round to nearest even (the `half` crate's rule, which the CPU uses), done
// on integers: pack2x16float's rounding is left to the implementation.
fn f16_bits(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    let sign = (x >> 16u) & 0x8000u;
    let a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    if (a >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    if (a >= 0x38800000u) {
        let r = a + 0xfffu + ((a >> 13u) & 1u);
        return sign | ((r - 0x38000000u) >> 13u);
    }
    let e = a >> 23u;
    if (e < 102u) {
        return sign;
    }
    let m = (a & 0x7fffffu) | 0x800000u;
    let s = 126u - e;
    var q = m >> s;
    let rem = m & ((1u << s) - 1u);
    let half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u) == 1u)) {
        q = q + 1u;
    }
    return sign | q;
}

fn f16_to_f32(bits: u32) -> f32 {
    return unpack2x16float(bits & 0xffffu).x;
}

fn round_f16(f: f32) -> f32 {
    return f16_to_f32(f16_bits(f));
}

// Rounds to bf16 and back: nearest even, NaN kept quiet (the `half` crate's rule).
fn round_bf16(f: f32) -> f32 {
    let x = bitcast<u32>(f);
    var h: u32;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        h = (x >> 16u) | 0x40u;
    } else if ((x & 0x8000u) != 0u && (x & 0x17fffu) != 0u) {
        h = (x >> 16u) + 1u;
    } else {
        h = x >> 16u;
    }
    return bitcast<f32>(h << 16u);
}

// The CPU backend's e^x (ops/activation.rs), operation for operation: clamp to [−87, 88],
// x = n·ln2 + r (Cody–Waite), a degree-7 Taylor polynomial of e^r, times 2^n.
// The CPU finds n = round-to-even(x·log2 e) by adding and subtracting 1.5·2^23; a shader
// compiler may fold (a + b) − b to a (Mesa does: SPIR-V from WGSL marks no operation
// exact), so n comes from round(), which is the same number by definition. The constants
// are f32 divisions, as the CPU's are (`1.0f / 5040.0f`, not an f64 quotient rounded).
fn exp_cpu(x_in: f32) -> f32 {
    let x = min(max(x_in, -87.0f), 88.0f);
    let n = round(x * 1.44269504088896341f);
    let r = (x - n * 0.6933594f) - n * -2.1219444e-4f;
    let two_n = bitcast<f32>((i32(n) + 127) << 23u);
    var p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * two_n;
}

// SwiGLU's silu(g) · up, silu(g) = g / (1 + e^−g) (the binary kernel's, and the quantizer's
// that takes it on the way).
fn op_swiglu(g: f32, up: f32) -> f32 {
    return (g / (1.0 + exp_cpu(-g))) * up;
}

// Each byte of `v` (every one in 0..127) minus `k` (≤ 128), as four signed bytes: the set
// top bits stop borrows from crossing bytes.
fn sub_bytes(v: u32, k: u32) -> u32 {
    return ((v | 0x80808080u) - k * 0x01010101u) ^ 0x80808080u;
}

// The 5th bits of four elements (bits 0–3 of `h`) moved to bit 4 of four bytes.
fn spread_bit4(h: u32) -> u32 {
    return ((h & 1u) << 4u) | ((h & 2u) << 11u) | ((h & 4u) << 18u) | ((h & 8u) << 25u);
}

// A flat invocation index over a dispatch of (x, y) workgroups of `size` invocations: the
// host splits large 1-D launches over y (max_compute_workgroups_per_dimension).
fn flat_id(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, size: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * size + lid;
}
