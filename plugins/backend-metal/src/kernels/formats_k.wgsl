// The 256-element super-block formats (Q2_K … Q6_K). `deq_<name>(b, i)` decodes element i
// of the super-block at byte b as the CPU backend's scalar functions do
// (formats/k_quants/*.rs, the oracle). For matmul a chunk `sub` is elements
// 32 sub … 32 sub + 31, i.e. 16-element groups 2 sub and 2 sub + 1; b0, b1 are the
// activation's sums of those groups. `part_<name>` gives the chunk's share of the CPU's
// integer `isum` (Σ scale · group dot, .x) and `msum` (Σ min · bsums, .y); `comb_<name>`
// is the CPU's `vec_dot` formula.

// Q2_K: scales[16] (4-bit scale | 4-bit min), qs[64] (2-bit), f16 d, f16 dmin.
fn deq_q2_k(b: u32, i: u32) -> f32 {
    let sub = i / 32u;
    let l = i % 32u;
    let sc = w_u8(b + i / 16u);
    let q = (w_u8(b + 16u + 32u * (sub / 4u) + l) >> (2u * (sub % 4u))) & 3u;
    return w_f16(b + 80u) * f32(sc & 15u) * f32(q) - w_f16(b + 82u) * f32(sc >> 4u);
}

// The signed 6-bit scale j of a Q3_K block (12 packed bytes at p).
fn q3_k_scale(p: u32, j: u32) -> i32 {
    let low = (w_u8(p + j % 8u) >> (4u * (j / 8u))) & 15u;
    let high = (w_u8(p + 8u + j % 4u) >> (2u * (j / 4u))) & 3u;
    return i32(low | (high << 4u)) - 32;
}

// Q3_K: hmask[32], qs[64] (2-bit), 12 bytes of 6-bit signed scales, f16 d.
fn deq_q3_k(b: u32, i: u32) -> f32 {
    let sub = i / 32u;
    let l = i % 32u;
    let scale = q3_k_scale(b + 96u, i / 16u);
    var q = i32((w_u8(b + 32u + 32u * (sub / 4u) + l) >> (2u * (sub % 4u))) & 3u);
    if (((w_u8(b + l) >> sub) & 1u) == 0u) {
        q -= 4;
    }
    return w_f16(b + 108u) * f32(scale) * f32(q);
}

// The 6-bit scale (.x) and min (.y) of sub-block j of a Q4_K/Q5_K block (12 bytes at p).
fn scale_min_k4(j: u32, p: u32) -> vec2<i32> {
    if (j < 4u) {
        return vec2<i32>(i32(w_u8(p + j) & 63u), i32(w_u8(p + j + 4u) & 63u));
    }
    let sc = (w_u8(p + j + 4u) & 15u) | ((w_u8(p + j - 4u) >> 6u) << 4u);
    let mn = (w_u8(p + j + 4u) >> 4u) | ((w_u8(p + j) >> 6u) << 4u);
    return vec2<i32>(i32(sc), i32(mn));
}

// Q4_K: f16 d, f16 dmin, 12 scale bytes, qs[128] (4-bit); x = d sc q - dmin m.
fn deq_q4_k(b: u32, i: u32) -> f32 {
    let sub = i / 32u;
    let l = i % 32u;
    let sm = scale_min_k4(sub, b + 4u);
    let dl = w_f16(b) * f32(sm.x);
    let ml = w_f16(b + 2u) * f32(sm.y);
    let q = (w_u8(b + 16u + 32u * (sub / 2u) + l) >> (4u * (sub % 2u))) & 15u;
    return dl * f32(q) - ml;
}

// Q5_K: as Q4_K with a fifth bit per element in qh[32].
fn deq_q5_k(b: u32, i: u32) -> f32 {
    let sub = i / 32u;
    let l = i % 32u;
    let sm = scale_min_k4(sub, b + 4u);
    let dl = w_f16(b) * f32(sm.x);
    let ml = w_f16(b + 2u) * f32(sm.y);
    let q = ((w_u8(b + 48u + 32u * (sub / 2u) + l) >> (4u * (sub % 2u))) & 15u)
        | (((w_u8(b + 16u + l) >> sub) & 1u) << 4u);
    return dl * f32(q) - ml;
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 signed 8-bit scales, f16 d.
fn deq_q6_k(b: u32, i: u32) -> f32 {
    let h = i / 128u;
    let r = i % 128u;
    let low = (w_u8(b + 64u * h + r % 64u) >> (4u * (r / 64u))) & 15u;
    let high = (w_u8(b + 128u + 32u * h + r % 32u) >> (2u * (r / 32u))) & 3u;
    return w_f16(b + 208u) * f32(w_i8(b + 192u + i / 16u)) * f32(i32(low | (high << 4u)) - 32);
}

fn dec_q2_k(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    let qs = b + 16u + 32u * (sub / 4u);
    let shift = 2u * (sub % 4u);
    for (var j = 0u; j < 8u; j++) {
        c.q[j] = (w_u32(qs + 4u * j) >> shift) & 0x03030303u;
    }
    let s0 = w_u8(b + 2u * sub);
    let s1 = w_u8(b + 2u * sub + 1u);
    c.k = vec4<i32>(i32(s0 & 15u), i32(s1 & 15u), i32(s0 >> 4u), i32(s1 >> 4u));
    return c;
}

fn dec_q3_k(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    let qs = b + 32u + 32u * (sub / 4u);
    let shift = 2u * (sub % 4u);
    for (var j = 0u; j < 8u; j++) {
        let low = (w_u32(qs + 4u * j) >> shift) & 0x03030303u;
        let high = (w_u32(b + 4u * j) >> sub) & 0x01010101u;
        c.q[j] = sub_bytes(low | (high << 2u), 4u);
    }
    c.k = vec4<i32>(q3_k_scale(b + 96u, 2u * sub), q3_k_scale(b + 96u, 2u * sub + 1u), 0, 0);
    return c;
}

fn dec_q4_k(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    let qs = b + 16u + 32u * (sub / 2u);
    let shift = 4u * (sub % 2u);
    for (var j = 0u; j < 8u; j++) {
        c.q[j] = (w_u32(qs + 4u * j) >> shift) & 0x0f0f0f0fu;
    }
    let sm = scale_min_k4(sub, b + 4u);
    c.k = vec4<i32>(sm.x, sm.y, 0, 0);
    return c;
}

fn dec_q5_k(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    let qs = b + 48u + 32u * (sub / 2u);
    let shift = 4u * (sub % 2u);
    for (var j = 0u; j < 8u; j++) {
        let low = (w_u32(qs + 4u * j) >> shift) & 0x0f0f0f0fu;
        let high = (w_u32(b + 16u + 4u * j) >> sub) & 0x01010101u;
        c.q[j] = low | (high << 4u);
    }
    let sm = scale_min_k4(sub, b + 4u);
    c.k = vec4<i32>(sm.x, sm.y, 0, 0);
    return c;
}

fn dec_q6_k(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    let h = sub / 4u;
    let r = sub % 4u;
    let ql = b + 64u * h + 32u * (r % 2u);
    let qh = b + 128u + 32u * h;
    for (var j = 0u; j < 8u; j++) {
        let low = (w_u32(ql + 4u * j) >> (4u * (r / 2u))) & 0x0f0f0f0fu;
        let high = (w_u32(qh + 4u * j) >> (2u * r)) & 0x03030303u;
        c.q[j] = sub_bytes(low | (high << 4u), 32u);
    }
    c.k = vec4<i32>(w_i8(b + 192u + 2u * sub), w_i8(b + 192u + 2u * sub + 1u), 0, 0);
    return c;
}

fn part_q2_k(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(c.k.x * dot4w(c, a, 0u) + c.k.y * dot4w(c, a, 4u), c.k.z * b0 + c.k.w * b1);
}

fn part_q3_k(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(c.k.x * dot4w(c, a, 0u) + c.k.y * dot4w(c, a, 4u), 0);
}

fn part_q4_k(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(c.k.x * dot8w(c, a), c.k.y * (b0 + b1));
}

fn part_q5_k(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(c.k.x * dot8w(c, a), c.k.y * (b0 + b1));
}

fn part_q6_k(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(c.k.x * dot4w(c, a, 0u) + c.k.y * dot4w(c, a, 4u), 0);
}

// sum += d_a · d · isum − d_a · dmin · msum
fn comb_q2_k(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (da * w_f16(b + 80u)) * f32(ip) - (da * w_f16(b + 82u)) * f32(mp);
}

// sum += d_a · d · isum
fn comb_q3_k(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (da * w_f16(b + 108u)) * f32(ip);
}

fn comb_q4_k(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (da * w_f16(b)) * f32(ip) - (da * w_f16(b + 2u)) * f32(mp);
}

fn comb_q5_k(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (da * w_f16(b)) * f32(ip) - (da * w_f16(b + 2u)) * f32(mp);
}

fn comb_q6_k(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (da * w_f16(b + 208u)) * f32(ip);
}
