// rowmatmul_{NAME}: as matmul_quant.wgsl (same activations, same per-block arithmetic, the
// same bits), but one invocation per weight row, which adds the row's block values itself,
// in order: no workgroup memory and no barriers. For CPU adapters (lavapipe runs each
// barrier as a switch between invocations, and a workgroup per row as 64 invocations of
// which few work); a GPU gets matmul_quant.wgsl.
//
// `acc + (a·b + c·d)` is not `(acc + a·b) + c·d` in floats, but a compiler that may
// reassociate (SPIR-V from WGSL marks nothing exact; Mesa does it) can make one of the other.
// So each block's value passes through `opaque` (an OR with a uniform zero, which the
// compiler cannot see through) before it is added, as the workgroup kernel's value passes
// through workgroup memory.
const TOK: u32 = 8u;

struct Params {
    cols: u32,
    rows: u32,
    row_bytes: u32,
    n_tokens: u32,
    row0: u32,
    out_stride: u32,
    d_off: u32,
    s_off: u32,
    out_off: u32,
    zero: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(2) var<storage, read> A: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

fn opaque(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) | P.zero);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (row >= P.rows) {
        return;
    }
    let t0 = wid.z * TOK;
    let nt = min(TOK, P.n_tokens - t0);
    let wr = row * P.row_bytes;
    let nb = P.cols / {QK}u;
    let cw = P.cols / 4u;
    var acc: array<f32, 8>;
    for (var blk = 0u; blk < nb; blk++) {
        let boff = wr + blk * {BYTES}u;
        var ip: array<i32, 8>;
        var mp: array<i32, 8>;
        for (var sub = 0u; sub < {QK}u / 32u; sub++) {
            let c = dec_{NAME}(boff, sub);
            let chunk = blk * ({QK}u / 32u) + sub;
            for (var t = 0u; t < nt; t++) {
                let tok = t0 + t;
                var a: array<u32, 8>;
                for (var j = 0u; j < 8u; j++) {
                    a[j] = A[tok * cw + chunk * 8u + j];
                }
                var b0 = 0;
                var b1 = 0;
                if ({QK}u == 256u) {
                    let bs = P.s_off + tok * (P.cols / 16u) + 2u * chunk;
                    b0 = bitcast<i32>(A[bs]);
                    b1 = bitcast<i32>(A[bs + 1u]);
                }
                let p = part_{NAME}(c, a, b0, b1);
                ip[t] += p.x;
                mp[t] += p.y;
            }
        }
        for (var t = 0u; t < nt; t++) {
            let ab = (t0 + t) * nb + blk;
            let da = bitcast<f32>(A[P.d_off + ab]);
            var sa = 0.0;
            if ({QK}u == 32u) {
                sa = bitcast<f32>(A[P.s_off + ab]);
            }
            acc[t] = acc[t] + opaque(comb_{NAME}(boff, ip[t], mp[t], da, sa));
        }
    }
    for (var t = 0u; t < nt; t++) {
        OUT[P.out_off + (t0 + t) * P.out_stride + P.row0 + row] = acc[t];
    }
}
