// Rotary position embedding, the CPU backend's semantics (ops/rope.rs): the (cos, sin) of
// every pair of every token comes from the host (rope_table.rs, computed as the CPU computes
// it), the rotation is the CPU's. NeoX pairs element i with i + n_rot/2, the original
// ordering 2i with 2i + 1. One invocation per (token, head, pair).
struct Params {
    n_tokens: u32,
    n_head: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32,
    x_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> CS: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let half = P.n_rot / 2u;
    let idx = flat_id(wid, nwg, lid, 64u);
    if (idx >= P.n_tokens * P.n_head * half) {
        return;
    }
    let i = idx % half;
    let th = idx / half;
    let t = th / P.n_head;
    let c = CS[(t * half + i) * 2u];
    let s = CS[(t * half + i) * 2u + 1u];
    let head = P.x_off + th * P.head_dim;
    var a = 2u * i;
    var b = 2u * i + 1u;
    if (P.neox != 0u) {
        a = i;
        b = i + half;
    }
    let x0 = X[head + a];
    let x1 = X[head + b];
    X[head + a] = x0 * c - x1 * s;
    X[head + b] = x0 * s + x1 * c;
}
