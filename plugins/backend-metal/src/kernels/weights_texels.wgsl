// A Q4_1 or Q8_0 weight as an Rgba32Uint texture (crate::texels): texture row = weight row,
// each block's quants in whole texels, then the blocks' scale words, 4 per texel. llvmpipe
// fetches a texel as one 16-byte load per lane, where it reads a storage buffer word by
// word, lane by lane.
@group(0) @binding(4) var WT: texture_2d<u32>;

// Scale word of block `blk` in a row of `nb` blocks whose quants take `q` texels each.
fn tex_scale(row: u32, blk: u32, nb: u32, q: u32) -> u32 {
    let s = textureLoad(WT, vec2<u32>(nb * q + blk / 4u, row), 0);
    let j = blk & 3u;
    return select(select(s.x, s.y, j == 1u), select(s.z, s.w, j == 3u), j >= 2u);
}

fn tex_q4_1(row: u32, blk: u32, nb: u32) -> Block32 {
    return q4_1_block(tex_scale(row, blk, nb, 1u), textureLoad(WT, vec2<u32>(blk, row), 0));
}

fn tex_q8_0(row: u32, blk: u32, nb: u32) -> Block32 {
    var k: Block32;
    k.lo = textureLoad(WT, vec2<u32>(2u * blk, row), 0);
    k.hi = textureLoad(WT, vec2<u32>(2u * blk + 1u, row), 0);
    k.d = f16_to_f32(tex_scale(row, blk, nb, 2u));
    return k;
}

// As `tex_<name>`, with the block's scale word already read: an unrolled kernel reads each
// texel of 4 scale words once, for 4 blocks (`tex_scales`).
fn tex_scales(row: u32, nb: u32, q: u32, group: u32) -> vec4<u32> {
    return textureLoad(WT, vec2<u32>(nb * q + group, row), 0);
}

fn tex_q4_1_s(row: u32, blk: u32, s: u32) -> Block32 {
    return q4_1_block(s, textureLoad(WT, vec2<u32>(blk, row), 0));
}

fn tex_q8_0_s(row: u32, blk: u32, s: u32) -> Block32 {
    var k: Block32;
    k.lo = textureLoad(WT, vec2<u32>(2u * blk, row), 0);
    k.hi = textureLoad(WT, vec2<u32>(2u * blk + 1u, row), 0);
    k.d = f16_to_f32(s);
    return k;
}
