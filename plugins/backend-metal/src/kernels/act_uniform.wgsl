// The quantized activations in a uniform buffer (llvmpipe loads a uniform buffer at a
// lane-invariant address once): quants at word offsets that are multiples of 4.
@group(0) @binding(2) var<uniform> AU: array<vec4<u32>, {ACT_VEC4S}>;

fn act_word(i: u32) -> u32 {
    return AU[i >> 2u][i & 3u];
}

fn act_quants(a: u32) -> vec4<u32> {
    return AU[a >> 2u];
}
