// The F16 KV cache and causal attention over it (GQA, sliding window, logit soft-capping).
// Cache layout per layer: K [n_ctx][n_head_kv][head_dim_k], V [n_ctx][n_head_kv][head_dim_v],
// f16 bits, so a batch of new positions is one contiguous stretch.

#define ATT_WARPS 4
// The largest head size (the CPU backend's limit too).
#define ATT_MAX_HEAD_DIM 512

// dst[i] = f16(src[i]): storing new keys or values into the cache.
extern "C" __global__ void store_f16(const float* src, u16* dst, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        dst[i] = f32_to_f16(src[i]);
}

// Grid (n_head, n_tokens), block 32 * ATT_WARPS. Query token t sits at position start + t
// and sees keys first = max(0, pos + 1 - window) ..= pos. The numerics are the CPU
// backend's (ops/attention.rs, llama.cpp's non-flash attention), step for step: q rounded
// to f16; s_j = scale · (q · k_j) in the CPU's summation order, soft-capped; e_j = exp(s_j − max); total = Σ e_j in f64;
// p_j = f16(e_j · (1 / total)); out = Σ_j p_j · v_j in key order, a multiply then an add.
// `scores` is scratch of `span` floats per (token, head).
extern "C" __global__ void attention(const float* q, const u16* kc, const u16* vc, float* out,
                                     float* scores, u32 n_head, u32 n_head_kv, u32 dk, u32 dv,
                                     u32 start, u32 window, float scale, float softcap,
                                     u32 span) {
    const float neg_inf = __int_as_float(0xff800000);
    const u32 h = blockIdx.x, t = blockIdx.y;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 kvh = h / (n_head / n_head_kv);
    const u32 pos = start + t;
    const u32 first = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    const u32 n = pos + 1 - first;

    __shared__ float qs[ATT_MAX_HEAD_DIM];
    __shared__ float red_max[ATT_WARPS];
    __shared__ double red_sum[ATT_WARPS];

    const float* qh = q + ((u64)t * n_head + h) * dk;
    for (u32 d = threadIdx.x; d < dk; d += blockDim.x) qs[d] = round_f16(qh[d]);
    __syncthreads();

    // Scores, one key per warp at a time, q · k summed in the CPU's order (its F16 vec_dot,
    // formats/float.rs): element d into accumulator d % 16 (lanes 0–15), the 16 folded by
    // halving, the dk % 16 tail added after in order. f16 × f16 products are exact in f32.
    float* sc = scores + ((u64)t * n_head + h) * span;
    float m = neg_inf;
    const u32 full = dk / 16 * 16;
    for (u32 i = warp; i < n; i += ATT_WARPS) {
        const u16* kr = kc + ((u64)(first + i) * n_head_kv + kvh) * dk;
        float s = 0.0f;
        if (lane < 16)
            for (u32 d = lane; d < full; d += 16)
                s = __fadd_rn(s, __fmul_rn(qs[d], f16_to_f32(kr[d])));
        for (u32 o = 8; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_down_sync(0xffffffffu, s, o));
        if (lane == 0)
            for (u32 d = full; d < dk; d++) s = __fadd_rn(s, __fmul_rn(qs[d], f16_to_f32(kr[d])));
        s = __shfl_sync(0xffffffffu, s, 0);
        s = __fmul_rn(scale, s);
        if (softcap != 0.0f) s = __fmul_rn(softcap, tanhf(s / softcap));
        if (lane == 0) sc[i] = s;
        m = fmaxf(m, s);
    }
    if (lane == 0) red_max[warp] = m;
    __syncthreads();
    m = red_max[0];
    for (int w = 1; w < ATT_WARPS; w++) m = fmaxf(m, red_max[w]);

    // exp and the f64 total.
    double total = 0.0;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        // Rounded from double: the correctly rounded e^x, which libm's expf (the CPU's)
        // returns in all but the rarest cases; CUDA's expf is up to 2 ulp off, enough to
        // move a probability across an f16 rounding boundary now and then.
        const float e = (float)exp((double)(sc[i] - m));
        sc[i] = e;
        total += (double)e;
    }
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) red_sum[warp] = total;
    __syncthreads();
    total = 0.0;
    for (int w = 0; w < ATT_WARPS; w++) total += red_sum[w];
    const float norm = total > 0.0 ? (float)(1.0 / total) : 0.0f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) sc[i] = round_f16(__fmul_rn(sc[i], norm));
    __syncthreads();

    // Weighted values: one output dimension per thread, keys in order.
    float* oh = out + ((u64)t * n_head + h) * dv;
    for (u32 d = threadIdx.x; d < dv; d += blockDim.x) {
        float o = 0.0f;
        const u16* vr = vc + ((u64)first * n_head_kv + kvh) * dv + d;
        for (u32 i = 0; i < n; i++)
            o = __fadd_rn(o, __fmul_rn(sc[i], f16_to_f32(vr[(u64)i * n_head_kv * dv])));
        oh[d] = o;
    }
}
