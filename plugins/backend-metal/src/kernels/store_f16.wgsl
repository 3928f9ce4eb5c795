// store_f16: a token range's new keys and values into the F16 KV cache in one dispatch, two
// elements per word: invocation i < k_words writes
// KC[k_off + i] = f16(KS[k_src + 2i]) | f16(KS[k_src + 2i + 1]) << 16, the next v_words
// invocations the same from VS into VC.
struct Params {
    k_words: u32,
    k_off: u32,
    k_src: u32,
    v_words: u32,
    v_off: u32,
    v_src: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> KS: array<f32>;
@group(0) @binding(2) var<storage, read_write> KC: array<u32>;
@group(0) @binding(3) var<storage, read> VS: array<f32>;
@group(0) @binding(4) var<storage, read_write> VC: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid, 64u);
    if (i < P.k_words) {
        let s = P.k_src + 2u * i;
        KC[P.k_off + i] = f16_bits(KS[s]) | (f16_bits(KS[s + 1u]) << 16u);
    } else if (i - P.k_words < P.v_words) {
        let j = i - P.k_words;
        let s = P.v_src + 2u * j;
        VC[P.v_off + j] = f16_bits(VS[s]) | (f16_bits(VS[s + 1u]) << 16u);
    }
}
