// scale: X[i] *= s, over n elements from x_off.
struct Params {
    n: u32,
    s: f32,
    x_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid, 64u);
    if (i >= P.n) {
        return;
    }
    X[P.x_off + i] = X[P.x_off + i] * P.s;
}
