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

// Whole-block reads for the row kernels (matmul_legacy_rows.wgsl), which load each word of
// a block once: `blk_<name>(b)` gives the block at byte b as 8 words of quants (elements
// 4j … 4j + 3 in word j: `lo` words 0–3, `hi` words 4–7) and its scales as f32 (f16 → f32
// is exact). Blocks are 2-byte aligned: Q4_1's 20 and Q5_1's 24 bytes keep rows' word
// alignment, Q4_0's 18, Q5_0's 22 and Q8_0's 34 bytes start on a word or half-way into
// one (`odd`), which the same words serve by a shift and a select.
struct Block32 {
    lo: vec4<u32>,
    hi: vec4<u32>,
    d: f32,
    m: f32,
}

// The words at bytes 4i + 2 … of words x (4i …) and y (4i + 4 …).
fn mid4(x: vec4<u32>, y: vec4<u32>) -> vec4<u32> {
    return (x >> vec4<u32>(16u)) | (y << vec4<u32>(16u));
}

fn sub_bytes4(v: vec4<u32>, k: u32) -> vec4<u32> {
    let top = vec4<u32>(0x80808080u);
    return ((v | top) - vec4<u32>(k * 0x01010101u)) ^ top;
}

// The 5th bits of elements 4j … 4j + 3 (bits 4j … 4j + 3 of qh) at bit 4 of word j's bytes.
fn spread4(qh: u32) -> vec4<u32> {
    let h = vec4<u32>(qh, qh >> 4u, qh >> 8u, qh >> 12u);
    let one = vec4<u32>(1u);
    return ((h & one) << vec4<u32>(4u)) | ((h & vec4<u32>(2u)) << vec4<u32>(11u))
        | ((h & vec4<u32>(4u)) << vec4<u32>(18u)) | ((h & vec4<u32>(8u)) << vec4<u32>(25u));
}

// The f16 at byte b of a 2-byte-aligned block whose first word is w0.
fn head_f16(w0: u32, odd: bool) -> f32 {
    return f16_to_f32(select(w0, w0 >> 16u, odd));
}

fn blk_q8_0(b: u32) -> Block32 {
    let i = b >> 2u;
    let odd = (b & 2u) != 0u;
    let x0 = vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u]);
    let x1 = vec4<u32>(W[i + 4u], W[i + 5u], W[i + 6u], W[i + 7u]);
    let w8 = W[i + 8u];
    let y0 = vec4<u32>(x0.yzw, x1.x);
    let y1 = vec4<u32>(x1.yzw, w8);
    var k: Block32;
    k.d = head_f16(x0.x, odd);
    k.lo = select(mid4(x0, y0), y0, odd);
    k.hi = select(mid4(x1, y1), y1, odd);
    return k;
}

fn blk_q4_0(b: u32) -> Block32 {
    let i = b >> 2u;
    let odd = (b & 2u) != 0u;
    let x = vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u]);
    let y = vec4<u32>(x.yzw, W[i + 4u]);
    let v = select(mid4(x, y), y, odd);
    var k: Block32;
    k.d = head_f16(x.x, odd);
    k.lo = sub_bytes4(v & vec4<u32>(0x0f0f0f0fu), 8u);
    k.hi = sub_bytes4((v >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu), 8u);
    return k;
}

fn blk_q5_0(b: u32) -> Block32 {
    let i = b >> 2u;
    let odd = (b & 2u) != 0u;
    let w0 = W[i];
    let x = vec4<u32>(W[i + 1u], W[i + 2u], W[i + 3u], W[i + 4u]);
    let y = vec4<u32>(x.yzw, W[i + 5u]);
    let qh = select((w0 >> 16u) | (x.x << 16u), x.x, odd);
    let v = select(mid4(x, y), y, odd);
    var k: Block32;
    k.d = head_f16(w0, odd);
    k.lo = sub_bytes4((v & vec4<u32>(0x0f0f0f0fu)) | spread4(qh), 16u);
    k.hi = sub_bytes4(((v >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu)) | spread4(qh >> 16u), 16u);
    return k;
}

fn blk_q4_1(b: u32) -> Block32 {
    let i = b >> 2u;
    return q4_1_block(W[i], vec4<u32>(W[i + 1u], W[i + 2u], W[i + 3u], W[i + 4u]));
}

// A Q4_1 block from its scale word (f16 d, f16 m) and its 16 bytes of nibbles, wherever
// they were read from (the weight buffer, or a texture: weights_texels.wgsl).
fn q4_1_block(dm: u32, v: vec4<u32>) -> Block32 {
    var k: Block32;
    k.d = f16_to_f32(dm);
    k.m = f16_to_f32(dm >> 16u);
    k.lo = v & vec4<u32>(0x0f0f0f0fu);
    k.hi = (v >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu);
    return k;
}

fn blk_q5_1(b: u32) -> Block32 {
    let i = b >> 2u;
    let dm = W[i];
    let qh = W[i + 1u];
    let v = vec4<u32>(W[i + 2u], W[i + 3u], W[i + 4u], W[i + 5u]);
    var k: Block32;
    k.d = f16_to_f32(dm);
    k.m = f16_to_f32(dm >> 16u);
    k.lo = (v & vec4<u32>(0x0f0f0f0fu)) | spread4(qh);
    k.hi = ((v >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu)) | spread4(qh >> 16u);
    return k;
}

// `bval_<name>`: `comb_<name>` on a whole-block read: the CPU's formula, the same operations.
fn bval_q4_0(k: Block32, ip: i32, da: f32, sa: f32) -> f32 {
    return (f32(ip) * k.d) * da;
}

fn bval_q5_0(k: Block32, ip: i32, da: f32, sa: f32) -> f32 {
    return (f32(ip) * k.d) * da;
}

fn bval_q8_0(k: Block32, ip: i32, da: f32, sa: f32) -> f32 {
    return f32(ip) * (k.d * da);
}

// Two products a multiply, for the unrolled Q4_1 texel kernel (CPU adapters lower
// dot4I8Packed to a shift pair, a multiply and an add per byte). With W = w0 + w1·2^16
// (two nibbles) and A = a1 + a0·2^16 (two signed quants), W·A mod 2^32 = w0·a1 +
// (w0·a0 + w1·a1)·2^16: eight such products sum to T with |Σ w0·a1| ≤ 8·15·127 < 2^15 and
// |T| < 2^31, so (T + 2^15) >> 16 is exactly their Σ w·a. The integer sum is the CPU's.
struct Pairs {
    // For quant words u (elements 4j … 4j + 3): a[4j+2] + a[4j]·2^16 and a[4j+3] + a[4j+1]·2^16.
    ev: vec4<u32>,
    od: vec4<u32>,
}

fn act_pairs(u: vec4<u32>) -> Pairs {
    let s = bitcast<vec4<i32>>(u);
    let lo16 = vec4<i32>(-65536);
    var p: Pairs;
    p.ev = bitcast<vec4<u32>>(((s << vec4<u32>(8u)) >> vec4<u32>(24u))
        + ((s << vec4<u32>(24u)) >> vec4<u32>(8u)));
    p.od = bitcast<vec4<u32>>((s >> vec4<u32>(24u))
        + (((s << vec4<u32>(16u)) >> vec4<u32>(8u)) & lo16));
    return p;
}

// Σ q·a of a Q4_1 block's 16 bytes of nibbles `v` against a token's quants as pairs (`lo`:
// elements 0–15, `hi`: 16–31).
fn swar_q4_1(v: vec4<u32>, lo: Pairs, hi: Pairs) -> i32 {
    let m = vec4<u32>(0x000f000fu);
    let t = (v & m) * lo.ev + ((v >> vec4<u32>(8u)) & m) * lo.od
        + ((v >> vec4<u32>(4u)) & m) * hi.ev + ((v >> vec4<u32>(12u)) & m) * hi.od;
    let g0 = bitcast<i32>(t.x + t.y);
    let g1 = bitcast<i32>(t.z + t.w);
    return ((g0 + 32768) >> 16u) + ((g1 + 32768) >> 16u);
}

fn bval_q4_1(k: Block32, ip: i32, da: f32, sa: f32) -> f32 {
    return (k.d * da) * f32(ip) + k.m * sa;
}

fn bval_q5_1(k: Block32, ip: i32, da: f32, sa: f32) -> f32 {
    return (k.d * da) * f32(ip) + k.m * sa;
}
