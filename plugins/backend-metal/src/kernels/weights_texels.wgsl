// A Q4_1 or Q8_0 weight as an Rgba32Uint texture (crate::texels): a weight row is a row of
// texels, each block's quants in whole texels, then the blocks' scale words, 4 per texel;
// texels::INTERLEAVE weight rows (32) share a texture row, texel by texel. llvmpipe fetches
// a texel as one 16-byte load per lane, where it reads a storage buffer word by word, lane
// by lane. A read-only storage texture, not a sampled one: an image load has no mip level,
// so llvmpipe inlines it with one row stride for all lanes, where a sampled texture's load
// is a call that looks up each lane's level size and stride (15-25% of a matmul's time).
@group(0) @binding(4) var WT: texture_storage_2d<rgba32uint, read>;

// Texel t of weight row `row` (a weight's rows start at a multiple of the interleave,
// `P.tex0`: the weights of one format and row length share textures, in the order they were
// first used). The shift and mask are texels::INTERLEAVE's, filled in by the host.
fn texel(row: u32, t: u32) -> vec4<u32> {
    return textureLoad(WT, vec2<u32>((t << {IL_SHIFT}u) | (row & {IL_MASK}u), row >> {IL_SHIFT}u));
}

// Scale word of block `blk` in a row of `nb` blocks whose quants take `q` texels each.
fn tex_scale(row: u32, blk: u32, nb: u32, q: u32) -> u32 {
    let s = texel(row, nb * q + blk / 4u);
    let j = blk & 3u;
    return select(select(s.x, s.y, j == 1u), select(s.z, s.w, j == 3u), j >= 2u);
}

fn tex_q4_1(row: u32, blk: u32, nb: u32) -> Block32 {
    return q4_1_block(tex_scale(row, blk, nb, 1u), texel(row, blk));
}

fn tex_q8_0(row: u32, blk: u32, nb: u32) -> Block32 {
    var k: Block32;
    k.lo = texel(row, 2u * blk);
    k.hi = texel(row, 2u * blk + 1u);
    k.d = f16_to_f32(tex_scale(row, blk, nb, 2u));
    return k;
}

// As `tex_<name>`, with the block's scale word already read: an unrolled kernel reads each
// texel of 4 scale words once, for 4 blocks (`tex_scales`).
fn tex_scales(row: u32, nb: u32, q: u32, group: u32) -> vec4<u32> {
    return texel(row, nb * q + group);
}

fn tex_q4_1_s(row: u32, blk: u32, s: u32) -> Block32 {
    return q4_1_block(s, texel(row, blk));
}

fn tex_q8_0_s(row: u32, blk: u32, s: u32) -> Block32 {
    var k: Block32;
    k.lo = texel(row, 2u * blk);
    k.hi = texel(row, 2u * blk + 1u);
    k.d = f16_to_f32(s);
    return k;
}
