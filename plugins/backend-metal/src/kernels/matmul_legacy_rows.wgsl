// rowmatmul_tok{TOK}_{NAME}: the row-per-invocation matmul (matmul_quant_rows.wgsl) for the
// 32-element formats, shaped for llvmpipe, which runs 8 invocations per SIMD vector and
// loads storage buffers lane by lane (a bounds check and a branch each), even at addresses
// that are the same in every lane: each weight word is loaded once (`blk_{NAME}`), or the
// weight is a texture (`tex_{NAME}`, weights_texels.wgsl: 16-byte fetches), the
// activations come from a uniform buffer when they fit one (`act_*`: loaded once for all
// lanes), and nothing is an array indexed at run time (such arrays become scratch memory).
// A workgroup takes {TOK} tokens, each with its own accumulator (the host writes those
// lines, {TOK} of each); a last partial group repeats its last token and stores it once.
//
// Bits: each block's value is the CPU's formula (`bval_{NAME}`); blocks are added in order,
// each through `opaque` (see matmul_quant_rows.wgsl) so the compiler cannot reassociate.
struct Params {
    cols: u32,
    rows: u32,
    row_bytes: u32,
    n_tokens: u32,
    row0: u32,
    out_stride: u32,
    d_off: u32,
    s_off: u32,
    out_off: u32,
    zero: u32,
    // Texel kernels: the weight's first row in its texture (a multiple of 32).
    tex0: u32,
    // Kernels of several weights (`_seg2`, `_seg3`): where the second and third start
    // among the rows, and their outputs' offsets.
    b1: u32,
    b2: u32,
    out1_off: u32,
    out2_off: u32,
    // `_rope` kernels: the KV cache's words where this token's k and v go, and whether
    // RoPE pairs are NeoX's.
    kc_off: u32,
    vc_off: u32,
    neox: u32,
    // `_norm` kernels: the residual stream's first element and the norm's epsilon (f32).
    x_off: u32,
    eps: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
{ACT}

fn opaque(v: f32) -> f32 {
    return opaque_with(v, P.zero);
}

// `opaque` with `P.zero` read once by the caller (llvmpipe reads a uniform lane by lane).
fn opaque_with(v: f32, zero: u32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) | zero);
}

// Block `blk` of token `tok` against the weight block k: integer sum, then the CPU's formula.
fn token_value(k: Block32, tok: u32, blk: u32, nb: u32) -> f32 {
    let a = tok * (P.cols / 4u) + blk * 8u;
    let ab = tok * nb + blk;
    return block_value(k, act_quants(a), act_quants(a + 4u),
        bitcast<f32>(act_word({D_OFF} + ab)), bitcast<f32>(act_word({S_OFF} + ab)));
}

// As `token_value`, with the token's activations already read (`lo`, `hi`: its quants,
// `da`, `sa`: its block scale and sum): the unrolled texel kernel reads them once for the
// rows an invocation takes.
fn block_value(k: Block32, lo: vec4<u32>, hi: vec4<u32>, da: f32, sa: f32) -> f32 {
    let ip = dot4I8Packed(k.lo.x, lo.x) + dot4I8Packed(k.lo.y, lo.y)
        + dot4I8Packed(k.lo.z, lo.z) + dot4I8Packed(k.lo.w, lo.w)
        + dot4I8Packed(k.hi.x, hi.x) + dot4I8Packed(k.hi.y, hi.y)
        + dot4I8Packed(k.hi.z, hi.z) + dot4I8Packed(k.hi.w, hi.w);
    return bval_{NAME}(k, ip, da, sa);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (row >= P.rows) {
        return;
    }
    let t0 = wid.z * {TOK}u;
    let last = P.n_tokens - 1u;
    let nb = P.cols / 32u;
    let wr = row * P.row_bytes;
{DECLARE}
{BLOCKS}
{STORE}
}
