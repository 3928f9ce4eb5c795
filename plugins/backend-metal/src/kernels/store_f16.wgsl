// store_f16: new keys or values into the F16 KV cache, two elements per word:
// DST[off + i] = f16(SRC[s + 2i]) | f16(SRC[s + 2i + 1]) << 16, s = src_off.
struct Params {
    n_words: u32,
    off: u32,
    src_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> SRC: array<f32>;
@group(0) @binding(2) var<storage, read_write> DST: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid, 64u);
    if (i >= P.n_words) {
        return;
    }
    let s = P.src_off + 2u * i;
    DST[P.off + i] = f16_bits(SRC[s]) | (f16_bits(SRC[s + 1u]) << 16u);
}
