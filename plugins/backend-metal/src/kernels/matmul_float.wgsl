// matmul_{NAME}: OUT[t][row0 + row] = W[row] · A[t] for float weights, in the CPU's
// summation order (formats/float.rs `DOT_LANES`): element e goes to accumulator e % 16
// (`term_{NAME}`: fused for F32, a multiply, then an add for F16/BF16), the 16 are folded
// by halving. Rows are whole 32-element chunks (gpu-support's `WeightShape`): no tail. A workgroup is one row and four
// tokens, sixteen invocations (the accumulators) per token.
struct Params {
    cols: u32,
    rows: u32,
    row_bytes: u32,
    n_tokens: u32,
    row0: u32,
    out_stride: u32,
    a_off: u32,
    out_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(2) var<storage, read> A: array<f32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= P.rows) {
        return;
    }
    let cl = lid % 16u;
    let t = wid.z * 4u + lid / 16u;
    let wr = row * P.row_bytes;
    var acc = 0.0;
    if (t < P.n_tokens) {
        let xt = P.a_off + t * P.cols;
        for (var e = cl; e < P.cols; e += 16u) {
            acc = term_{NAME}(elem_{NAME}(wr, e), act_{NAME}(A[xt + e]), acc);
        }
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var o = 8u; o > 0u; o = o >> 1u) {
        if (cl < o) {
            red[lid] = red[lid] + red[lid + o];
        }
        workgroupBarrier();
    }
    if (cl == 0u && t < P.n_tokens) {
        OUT[P.out_off + t * P.out_stride + P.row0 + row] = red[lid];
    }
}
