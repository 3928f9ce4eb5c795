// matmul_{NAME}: OUT[t][row0 + row] = W[row] · A[t] for a quantized weight format, against
// activations quantized once per product (quantize_*.wgsl) to the format's 8-bit companion.
// A holds, in words: the quants (4 per word, token-major), from d_off each activation
// block's scale (f32 bits), from s_off Q8_1's d·Σq (f32 bits) or Q8_K's sums of 16 (i32).
//
// A workgroup is one weight row and up to TOK tokens. Each invocation takes whole weight
// blocks: it decodes a block's chunks once for every token, sums their integer products
// (exact in any order) and combines them with the scales by the CPU's formula (`comb_`);
// then the first invocations add the row's block values one after another, in block order,
// as the CPU does: the product is the CPU's bit for bit, where the driver does not fuse.
const TOK: u32 = 8u;
const WG: u32 = 64u;

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
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(2) var<storage, read> A: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

var<workgroup> vals: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= P.rows) {
        return;
    }
    let t0 = wid.z * TOK;
    let nt = min(TOK, P.n_tokens - t0);
    let wr = row * P.row_bytes;
    let nb = P.cols / {QK}u;
    let cw = P.cols / 4u;
    var acc = 0.0;
    for (var base = 0u; base < nb; base += WG) {
        let blk = base + lid;
        if (blk < nb) {
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
                vals[lid * TOK + t] = comb_{NAME}(boff, ip[t], mp[t], da, sa);
            }
        }
        workgroupBarrier();
        if (lid < nt) {
            let here = min(WG, nb - base);
            for (var i = 0u; i < here; i++) {
                acc = acc + vals[i * TOK + lid];
            }
        }
        workgroupBarrier();
    }
    if (lid < nt) {
        OUT[P.out_off + (t0 + lid) * P.out_stride + P.row0 + row] = acc;
    }
}
