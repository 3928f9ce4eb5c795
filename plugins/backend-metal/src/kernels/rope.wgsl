// Rotary position embedding, the CPU backend's semantics (ops/rope.rs): the (cos, sin) of
// every pair of every token comes from the host (rope_table.rs, computed as the CPU computes
// it), the rotation is the CPU's. NeoX pairs element i with i + n_rot/2, the original
// ordering 2i with 2i + 1. One invocation per (token, head, pair) of X; `rope_pair` then
// also turns X2's (n_head2 heads a token, from x2_off) by the same table: q and k in one
// dispatch. `rope_pair_store` then stores X2 and VS into the F16 KV cache as store_f16 does,
// each invocation of X2 whole words of it: a NeoX one turns pairs 2u and 2u + 1 (words at
// elements 2u and 2u + n_rot/2; the host checks n_rot = head_dim, a multiple of 4), an
// original-order one pair 2u, 2u + 1 (one word); VS's invocations come after.
struct Params {
    n_tokens: u32,
    n_head: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32,
    x_off: u32,
    n_head2: u32,
    x2_off: u32,
    // rope_pair_store: X2 (k) and VS (v) into the KV cache, from words kc_off and vc_off.
    kc_off: u32,
    v_words: u32,
    vc_off: u32,
    v_src: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> CS: array<f32>;
{X2_BINDING}

// Invocation idx's pair over rows of n_head heads: its two elements (from the range's
// start) and its (cos, sin) index.
fn pair_of(idx: u32, n_head: u32) -> vec3<u32> {
    let half = P.n_rot / 2u;
    let i = idx % half;
    let th = idx / half;
    let t = th / n_head;
    let head = th * P.head_dim;
    if (P.neox != 0u) {
        return vec3<u32>(head + i, head + i + half, t * half + i);
    }
    return vec3<u32>(head + 2u * i, head + 2u * i + 1u, t * half + i);
}

fn turn(x0: f32, x1: f32, e: vec3<u32>) -> vec2<f32> {
    let c = CS[e.z * 2u];
    let s = CS[e.z * 2u + 1u];
    return vec2<f32>(x0 * c - x1 * s, x0 * s + x1 * c);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = flat_id(wid, nwg, lid, 64u);
    let n1 = P.n_tokens * P.n_head * (P.n_rot / 2u);
    if (idx < n1) {
        let e = pair_of(idx, P.n_head);
        let r = turn(X[P.x_off + e.x], X[P.x_off + e.y], e);
        X[P.x_off + e.x] = r.x;
        X[P.x_off + e.y] = r.y;
    }
{SECOND}
}
