// rms_norm: one workgroup per row of n, the CPU backend's numerics (ops/norm.rs): the sum of
// squares in order in {SUM_T} (f64 where the adapter has SHADER_F64, as on the CPU; else
// f32), mean = sum / n, scale = 1 / sqrt(mean + eps) in f32, y = (x · scale) · w.
struct Params {
    n: u32,
    eps: f32,
    rows: u32,
    x_off: u32,
    out_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> WT: array<f32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

var<workgroup> row_scale: f32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= P.rows) {
        return;
    }
    let x0 = P.x_off + row * P.n;
    let o0 = P.out_off + row * P.n;
    if (lid == 0u) {
        var s = {SUM_T}(0);
        for (var i = 0u; i < P.n; i++) {
            let v = {SUM_T}(X[x0 + i]);
            s = s + v * v;
        }
        let mean = f32(s / {SUM_T}(P.n));
        row_scale = 1.0 / sqrt(mean + P.eps);
    }
    workgroupBarrier();
    let scale = row_scale;
    for (var i = lid; i < P.n; i += 64u) {
        OUT[o0 + i] = (X[x0 + i] * scale) * WT[i];
    }
}
