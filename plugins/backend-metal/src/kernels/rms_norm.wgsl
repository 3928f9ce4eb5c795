// rms_norm: one workgroup per row of n, the CPU backend's numerics (ops/norm.rs): the sum of
// squares in order in {SUM_T} (f64 where the adapter has SHADER_F64, as on the CPU; else
// f32), mean = sum / n, scale = 1 / sqrt(mean + eps) in f32, y = (x · scale) · w.
//
// Fused variants (crate::ops's deferred operations), each saving a dispatch:
// `add_rms_norm*` first adds the residual H into X (x = x + h, written back: the `add`
// kernel's arithmetic), and `*_q8_0` / `*_q8_1` also quantize y for the next matmul
// (quantize_blocks.wgsl, from the same values y, written to A as the quantize kernel would).
// The first invocation does the serial work (the add, the sum), as the plain kernel's does.
// {NWG} invocations a workgroup (64, or 8 for CPU adapters: kernels::NORM_NARROW_WG).
struct Params {
    n: u32,
    eps: f32,
    rows: u32,
    x_off: u32,
    out_off: u32,
    // add_rms_norm*: where the residual starts in H.
    h_off: u32,
    // *_q8_*: the quantized activations' layout in A (blocks numbered across rows).
    d_off: u32,
    s_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, {X_ACCESS}> X: array<f32>;
@group(0) @binding(2) var<storage, read> WT: array<f32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
{EXTRA_BINDINGS}

var<workgroup> row_scale: f32;
// The row's first element in X, for `qin`.
var<private> row_x0: u32;

// Element i of the row's output, y_i = (x_i · scale) · w_i (the value OUT receives).
fn qin(i: u32) -> f32 {
    return (X[row_x0 + i] * row_scale) * WT[i];
}

@compute @workgroup_size({NWG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= P.rows) {
        return;
    }
    let x0 = P.x_off + row * P.n;
    let o0 = P.out_off + row * P.n;
    row_x0 = x0;
    if (lid == 0u) {
        var s = {SUM_T}(0);
        for (var i = 0u; i < P.n; i++) {
{LOAD}
            let v = {SUM_T}(xi);
            s = s + v * v;
        }
        let mean = f32(s / {SUM_T}(P.n));
        row_scale = 1.0 / sqrt(mean + P.eps);
    }
    // The scale (and X, written by the first invocation in the add variants), for all.
{BARRIER}
    let scale = row_scale;
    for (var i = lid; i < P.n; i += {NWG}u) {
        OUT[o0 + i] = (X[x0 + i] * scale) * WT[i];
    }
{QUANTIZE}
}
