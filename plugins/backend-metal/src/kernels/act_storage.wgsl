// The quantized activations in a storage buffer (any size).
@group(0) @binding(2) var<storage, read> A: array<u32>;

fn act_word(i: u32) -> u32 {
    return A[i];
}

fn act_quants(a: u32) -> vec4<u32> {
    return vec4<u32>(A[a], A[a + 1u], A[a + 2u], A[a + 3u]);
}
