// The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. Element j of a block and
// element j + 16 share byte j of the quants (low and high nibble).
// `deq_<name>(b, j)`: element j of the block at byte b, as the CPU's dequantization.
// `dec_<name>(b, sub)`: the block's quants as packed signed bytes (a block is one chunk);
// `part_<name>`: its integer sums against one token's quants; `comb_<name>`: the CPU's
// `vec_dot` formula for one block (formats/q*.rs), operation for operation.

fn nibble(b: u32, j: u32) -> u32 {
    if (j < 16u) {
        return w_u8(b + j) & 15u;
    }
    return w_u8(b + j - 16u) >> 4u;
}

// The fifth bit of element j from the 32 high bits qh.
fn high5(qh: u32, j: u32) -> u32 {
    if (j < 16u) {
        return ((qh >> j) << 4u) & 0x10u;
    }
    return (qh >> (j - 4u)) & 0x10u;
}

// Q4_0: f16 d, 16 bytes of nibbles; x = (q - 8) d.
fn deq_q4_0(b: u32, j: u32) -> f32 {
    return f32(i32(nibble(b + 2u, j)) - 8) * w_f16(b);
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles; x = q d + m.
fn deq_q4_1(b: u32, j: u32) -> f32 {
    return f32(nibble(b + 4u, j)) * w_f16(b) + w_f16(b + 2u);
}

// Q5_0: f16 d, 32 high bits, 16 bytes of nibbles; x = (q - 16) d.
fn deq_q5_0(b: u32, j: u32) -> f32 {
    let q = nibble(b + 6u, j) | high5(w_u32(b + 2u), j);
    return f32(i32(q) - 16) * w_f16(b);
}

// Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of nibbles; x = q d + m.
fn deq_q5_1(b: u32, j: u32) -> f32 {
    let q = nibble(b + 8u, j) | high5(w_u32(b + 4u), j);
    return f32(q) * w_f16(b) + w_f16(b + 2u);
}

// Q8_0: f16 d, 32 signed bytes; x = q d.
fn deq_q8_0(b: u32, j: u32) -> f32 {
    return f32(w_i8(b + 2u + j)) * w_f16(b);
}

fn dec_q4_0(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    for (var j = 0u; j < 4u; j++) {
        let v = w_u32(b + 2u + 4u * j);
        c.q[j] = sub_bytes(v & 0x0f0f0f0fu, 8u);
        c.q[j + 4u] = sub_bytes((v >> 4u) & 0x0f0f0f0fu, 8u);
    }
    return c;
}

fn dec_q5_0(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    let qh = w_u32(b + 2u);
    for (var j = 0u; j < 4u; j++) {
        let v = w_u32(b + 6u + 4u * j);
        c.q[j] = sub_bytes((v & 0x0f0f0f0fu) | spread_bit4(qh >> (4u * j)), 16u);
        c.q[j + 4u] = sub_bytes(((v >> 4u) & 0x0f0f0f0fu) | spread_bit4(qh >> (16u + 4u * j)), 16u);
    }
    return c;
}

fn dec_q8_0(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    for (var j = 0u; j < 8u; j++) {
        c.q[j] = w_u32(b + 2u + 4u * j);
    }
    return c;
}

fn dec_q4_1(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    for (var j = 0u; j < 4u; j++) {
        let v = w_u32(b + 4u + 4u * j);
        c.q[j] = v & 0x0f0f0f0fu;
        c.q[j + 4u] = (v >> 4u) & 0x0f0f0f0fu;
    }
    return c;
}

fn dec_q5_1(b: u32, sub: u32) -> Chunk {
    var c: Chunk;
    let qh = w_u32(b + 4u);
    for (var j = 0u; j < 4u; j++) {
        let v = w_u32(b + 8u + 4u * j);
        c.q[j] = (v & 0x0f0f0f0fu) | spread_bit4(qh >> (4u * j));
        c.q[j + 4u] = ((v >> 4u) & 0x0f0f0f0fu) | spread_bit4(qh >> (16u + 4u * j));
    }
    return c;
}

fn part_q4_0(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(dot8w(c, a), 0);
}

fn part_q4_1(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(dot8w(c, a), 0);
}

fn part_q5_0(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(dot8w(c, a), 0);
}

fn part_q5_1(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(dot8w(c, a), 0);
}

fn part_q8_0(c: Chunk, a: array<u32, 8>, b0: i32, b1: i32) -> vec2<i32> {
    return vec2<i32>(dot8w(c, a), 0);
}

// sum += isum · d · d_a
fn comb_q4_0(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (f32(ip) * w_f16(b)) * da;
}

fn comb_q5_0(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (f32(ip) * w_f16(b)) * da;
}

// sum += isum · (d · d_a)
fn comb_q8_0(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return f32(ip) * (w_f16(b) * da);
}

// sum += d · d_a · isum + m · s_a
fn comb_q4_1(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (w_f16(b) * da) * f32(ip) + w_f16(b + 2u) * sa;
}

fn comb_q5_1(b: u32, ip: i32, mp: i32, da: f32, sa: f32) -> f32 {
    return (w_f16(b) * da) * f32(ip) + w_f16(b + 2u) * sa;
}
