// Causal attention over the F16 KV cache (GQA, sliding window, logit soft-capping). Cache
// layout per layer: K [n_ctx][n_head_kv][dk], V [n_ctx][n_head_kv][dv], f16 pairs per word.
// One workgroup per (head, token): query token t sits at position start + t and sees keys
// first = max(0, pos + 1 − window) ..= pos. The numerics are the CPU backend's
// (ops/attention.rs) step for step: q rounded to f16; s_j = scale · (q · k_j) in its F16
// vec_dot order (element d into accumulator d % 16, the 16 folded by halving, the dk % 16
// tail after), soft-capped; e_j = exp(s_j − max); total = Σ e_j in order in {TOTAL_T};
// p_j = f16(e_j · (1 / total)); out = Σ_j p_j · v_j in key order.
// SC is scratch of `span` floats per (token, head). Q and OUT start at q_off and out_off.
// {WG} invocations per workgroup (kernels::attention_workgroup); few barriers, since on a
// CPU adapter each one switches between the workgroup's SIMD vectors.
const WG: u32 = {WG}u;

struct Params {
    n_head: u32,
    n_head_kv: u32,
    dk: u32,
    dv: u32,
    start: u32,
    window: u32,
    scale: f32,
    softcap: f32,
    span: u32,
    q_off: u32,
    out_off: u32,
    // attention*_q8_*: the output also quantized into A for the next matmul (blocks of 32
    // within a head, numbered across heads and tokens), scales from d_off, sums from s_off.
    d_off: u32,
    s_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> K: array<u32>;
@group(0) @binding(3) var<storage, read> V: array<u32>;
@group(0) @binding(4) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(5) var<storage, read_write> SC: array<f32>;

var<workgroup> qs: array<f32, 512>;
var<workgroup> red: array<f32, WG>;
var<workgroup> norm_sh: f32;
{QUANT_DECLS}

fn half_at(words: u32, idx: u32) -> f32 {
    return f16_to_f32(words >> ((idx & 1u) * 16u));
}

// qs[d … d + 3].
fn q4(d: u32) -> vec4<f32> {
    return vec4<f32>(qs[d], qs[d + 1u], qs[d + 2u], qs[d + 3u]);
}

// K's halves idx … idx + 3 (a row of odd length: any alignment).
fn k4(idx: u32) -> vec4<f32> {
    return vec4<f32>(half_at(K[idx >> 1u], idx), half_at(K[(idx + 1u) >> 1u], idx + 1u),
        half_at(K[(idx + 2u) >> 1u], idx + 2u), half_at(K[(idx + 3u) >> 1u], idx + 3u));
}

{EXP_FN}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let kvh = h / (P.n_head / P.n_head_kv);
    let pos = P.start + t;
    var first = 0u;
    if (P.window > 0u && pos + 1u > P.window) {
        first = pos + 1u - P.window;
    }
    let n = pos + 1u - first;
    let qh = P.q_off + (t * P.n_head + h) * P.dk;
    for (var d = lid; d < P.dk; d += WG) {
        qs[d] = round_f16(Q[qh + d]);
    }
    workgroupBarrier();

    let sc = (t * P.n_head + h) * P.span;
    var m = bitcast<f32>(0xff800000u);
    let full = P.dk / 16u * 16u;
    for (var i = lid; i < n; i += WG) {
        let kb = ((first + i) * P.n_head_kv + kvh) * P.dk;
        // Accumulator d % 16 is lane d % 4 of a{(d % 16) / 4}: registers, where an array
        // indexed in a loop would be scratch memory read lane by lane on a CPU adapter.
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        var a2 = vec4<f32>(0.0);
        var a3 = vec4<f32>(0.0);
        if ((P.dk & 1u) == 0u) {
            // A row of K is whole words: each word read once for its two halves.
            for (var d0 = 0u; d0 < full; d0 += 16u) {
                let w = (kb + d0) >> 1u;
                a0 = a0 + q4(d0) * vec4<f32>(unpack2x16float(K[w]), unpack2x16float(K[w + 1u]));
                a1 = a1 + q4(d0 + 4u) * vec4<f32>(unpack2x16float(K[w + 2u]), unpack2x16float(K[w + 3u]));
                a2 = a2 + q4(d0 + 8u) * vec4<f32>(unpack2x16float(K[w + 4u]), unpack2x16float(K[w + 5u]));
                a3 = a3 + q4(d0 + 12u) * vec4<f32>(unpack2x16float(K[w + 6u]), unpack2x16float(K[w + 7u]));
            }
        } else {
            for (var d0 = 0u; d0 < full; d0 += 16u) {
                a0 = a0 + q4(d0) * k4(kb + d0);
                a1 = a1 + q4(d0 + 4u) * k4(kb + d0 + 4u);
                a2 = a2 + q4(d0 + 8u) * k4(kb + d0 + 8u);
                a3 = a3 + q4(d0 + 12u) * k4(kb + d0 + 12u);
            }
        }
        // The 16 folded by halving: 8, 4, 2, 1.
        a0 = a0 + a2;
        a1 = a1 + a3;
        a0 = a0 + a1;
        var s = (a0.x + a0.z) + (a0.y + a0.w);
        for (var d = full; d < P.dk; d++) {
            let idx = kb + d;
            s = s + qs[d] * half_at(K[idx >> 1u], idx);
        }
        s = P.scale * s;
        if (P.softcap != 0.0) {
            s = P.softcap * tanh_cap(s / P.softcap);
        }
        SC[sc + i] = s;
        m = max(m, s);
    }
    // The max is exact in any order: the first invocation takes it alone, one barrier
    // rather than a tree's six (each a switch between invocations on a CPU adapter).
    red[lid] = m;
    workgroupBarrier();
    if (lid == 0u) {
        for (var o = 1u; o < WG; o++) {
            m = max(m, red[o]);
        }
        norm_sh = m;
    }
    workgroupBarrier();
    m = norm_sh;
    for (var i = lid; i < n; i += WG) {
        SC[sc + i] = exp_shifted(SC[sc + i] - m);
    }
    storageBarrier();
    if (lid == 0u) {
        var total = {TOTAL_T}(0);
        for (var i = 0u; i < n; i++) {
            total = total + {TOTAL_T}(SC[sc + i]);
        }
        var norm = 0.0;
        if (total > {TOTAL_T}(0)) {
            norm = f32({TOTAL_T}(1) / total);
        }
        norm_sh = norm;
    }
    workgroupBarrier();
    let norm = norm_sh;
    // Each invocation rounds the probabilities it needs itself (the same bits every
    // time): no pass and no barrier between.
    let oh = P.out_off + (t * P.n_head + h) * P.dv;
    // Four dimensions an invocation where a row of V is whole words (dv even): each word
    // of V and each probability is read once for them (on a CPU adapter every such read
    // is lane by lane). Each dimension's sum is the one below, in the same order.
    var quads = 0u;
    if ((P.dv & 1u) == 0u) {
        quads = P.dv / 4u;
    }
    for (var j = lid; j < quads; j += WG) {
        var o0 = 0.0;
        var o1 = 0.0;
        var o2 = 0.0;
        var o3 = 0.0;
        for (var i = 0u; i < n; i++) {
            let p = round_f16(SC[sc + i] * norm);
            let w = (((first + i) * P.n_head_kv + kvh) * P.dv + 4u * j) >> 1u;
            let a = V[w];
            let b = V[w + 1u];
            o0 = o0 + p * f16_to_f32(a);
            o1 = o1 + p * f16_to_f32(a >> 16u);
            o2 = o2 + p * f16_to_f32(b);
            o3 = o3 + p * f16_to_f32(b >> 16u);
        }
        let d = oh + 4u * j;
        OUT[d] = o0;
        OUT[d + 1u] = o1;
        OUT[d + 2u] = o2;
        OUT[d + 3u] = o3;
{QUANT_KEEP4}
    }
    for (var d = 4u * quads + lid; d < P.dv; d += WG) {
        var o = 0.0;
        for (var i = 0u; i < n; i++) {
            let idx = ((first + i) * P.n_head_kv + kvh) * P.dv + d;
            o = o + round_f16(SC[sc + i] * norm) * half_at(V[idx >> 1u], idx);
        }
        OUT[oh + d] = o;
{QUANT_KEEP1}
    }
{QUANTIZE}
}
