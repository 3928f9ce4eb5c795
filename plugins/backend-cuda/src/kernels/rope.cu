// Rotary position embedding, the CPU backend's semantics (ops/rope.rs): the (cos, sin) of
// every pair of every token comes from the host (rope_table.rs, computed exactly as the CPU
// computes it), and the rotation is the CPU's, a multiply then an add, never fused.
// NeoX pairs element i with i + n_rot/2, the original ordering 2i with 2i + 1.

// One thread per (token, head, pair); grid-stride over all of them. cs holds
// [cos, sin] × n_rot/2 per token.
extern "C" __global__ void rope(float* x, const float* cs, u32 n_tokens, u32 n_head,
                                u32 head_dim, u32 n_rot, u32 neox) {
    const u32 half = n_rot / 2;
    const u64 total = (u64)n_tokens * n_head * half;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (u64)gridDim.x * blockDim.x) {
        const u32 i = idx % half;
        const u64 th = idx / half;  // token * n_head + head
        const u32 t = th / n_head;
        const float c = cs[((u64)t * half + i) * 2], s = cs[((u64)t * half + i) * 2 + 1];
        float* head = x + th * head_dim;
        const u32 a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = head[a], x1 = head[b];
        head[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        head[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}
