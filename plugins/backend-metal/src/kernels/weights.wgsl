// A weight tensor (or a part of one: whole rows) in its stored blocks, read as little-endian
// bytes at any offset: blocks are 18, 22, 34, 110, 210 bytes and so not word aligned. The
// host pads the buffer by a word so a straddling read never runs off the end.
@group(0) @binding(1) var<storage, read> W: array<u32>;

fn w_u8(o: u32) -> u32 {
    return (W[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

fn w_i8(o: u32) -> i32 {
    return (bitcast<i32>(w_u8(o)) << 24u) >> 24u;
}

fn w_u16(o: u32) -> u32 {
    return w_u8(o) | (w_u8(o + 1u) << 8u);
}

fn w_u32(o: u32) -> u32 {
    let s = (o & 3u) * 8u;
    let i = o >> 2u;
    if (s == 0u) {
        return W[i];
    }
    return (W[i] >> s) | (W[i + 1u] << (32u - s));
}

fn w_f16(o: u32) -> f32 {
    return f16_to_f32(w_u16(o));
}

// A 32-element chunk of weight quants as 8 words of signed bytes (word j: elements
// 4j … 4j + 3) and up to four small integer scales.
struct Chunk {
    q: array<u32, 8>,
    k: vec4<i32>,
}

fn dot4w(c: Chunk, a: array<u32, 8>, first: u32) -> i32 {
    var s = 0;
    for (var j = first; j < first + 4u; j++) {
        s += dot4I8Packed(c.q[j], a[j]);
    }
    return s;
}

fn dot8w(c: Chunk, a: array<u32, 8>) -> i32 {
    return dot4w(c, a, 0u) + dot4w(c, a, 4u);
}
