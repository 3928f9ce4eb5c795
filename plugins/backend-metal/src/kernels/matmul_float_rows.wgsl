// rowmatmul_{NAME}: as matmul_float.wgsl (the CPU's order: element e into accumulator
// e % 16 by `term_{NAME}`, the 16 folded by halving; the same bits), one invocation per
// weight row and up to four tokens, no workgroup memory or barriers: for CPU adapters
// (see matmul_quant_rows.wgsl).
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

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (row >= P.rows) {
        return;
    }
    let t0 = wid.z * 4u;
    let nt = min(4u, P.n_tokens - t0);
    let wr = row * P.row_bytes;
    for (var t = t0; t < t0 + nt; t++) {
        let xt = P.a_off + t * P.cols;
        var acc: array<f32, 16>;
        for (var e0 = 0u; e0 < P.cols; e0 += 16u) {
            for (var l = 0u; l < 16u; l++) {
                let x = act_{NAME}(A[xt + e0 + l]);
                acc[l] = term_{NAME}(elem_{NAME}(wr, e0 + l), x, acc[l]);
            }
        }
        for (var o = 8u; o > 0u; o = o >> 1u) {
            for (var l = 0u; l < o; l++) {
                acc[l] = acc[l] + acc[l + o];
            }
        }
        OUT[P.out_off + t * P.out_stride + P.row0 + row] = acc[0];
    }
}
