// quantize_{KIND}: a matmul's activations quantized once per product (quantize_blocks.wgsl),
// one invocation per block, {QWG} a workgroup (64, or 8 on CPU adapters). quantize_swiglu_*: SwiGLU first (gate = silu(gate) · up, the
// binary kernel's arithmetic), written back and quantized: the down projection's input in
// one dispatch.
struct Params {
    n_blocks: u32,
    d_off: u32,
    s_off: u32,
    x_off: u32,
    // quantize_swiglu_*: where the up projection starts in UP.
    up_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, {X_ACCESS}> X: array<f32>;
{UP_BINDING}
@group(0) @binding(2) var<storage, read_write> A: array<u32>;

fn qin(i: u32) -> f32 {
    return X[i];
}

@compute @workgroup_size({QWG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let blk = flat_id(wid, nwg, lid, {QWG}u);
    if (blk >= P.n_blocks) {
        return;
    }
    {BODY}
}
