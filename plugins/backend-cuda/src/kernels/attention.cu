// The F16 KV cache and causal attention over it (GQA, sliding window, logit soft-capping).
// Cache layout per layer: K [n_ctx][n_head_kv][head_dim_k], V [n_ctx][n_head_kv][head_dim_v],
// f16 bits, so a batch of new positions is one contiguous stretch.

#define ATT_WARPS 4
// head_dim_v ≤ 32 * ATT_PER_LANE (= 512, the CPU backend's limit too).
#define ATT_PER_LANE 16
#define ATT_MAX_HEAD_DIM 512

// dst[i] = f16(src[i]): storing new keys or values into the cache.
extern "C" __global__ void store_f16(const float* src, u16* dst, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        dst[i] = f32_to_f16(src[i]);
}

// Grid (n_head, n_tokens), block 32 * ATT_WARPS. Warp w takes keys first + w, first + w +
// ATT_WARPS, … with an online softmax (running max m, sum l, output o); the warps' partial
// results are merged at the end. Query token t sits at position start + t and sees keys
// max(0, pos + 1 - window) ..= pos.
extern "C" __global__ void attention(const float* q, const u16* kc, const u16* vc, float* out,
                                     u32 n_head, u32 n_head_kv, u32 dk, u32 dv, u32 start,
                                     u32 window, float scale, float softcap) {
    const float neg_inf = __int_as_float(0xff800000);
    const u32 h = blockIdx.x, t = blockIdx.y;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 kvh = h / (n_head / n_head_kv);
    const u32 pos = start + t;
    const u32 first = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;

    __shared__ float qs[ATT_MAX_HEAD_DIM];
    __shared__ float part_m[ATT_WARPS], part_l[ATT_WARPS];
    __shared__ float part_o[ATT_WARPS][ATT_MAX_HEAD_DIM];

    const float* qh = q + ((u64)t * n_head + h) * dk;
    for (u32 d = threadIdx.x; d < dk; d += blockDim.x) qs[d] = qh[d];
    __syncthreads();

    float m = neg_inf, l = 0.0f, o[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) o[i] = 0.0f;
    for (u32 j = first + warp; j <= pos; j += ATT_WARPS) {
        const u16* kr = kc + ((u64)j * n_head_kv + kvh) * dk;
        float s = 0.0f;
        for (u32 d = lane; d < dk; d += 32) s += qs[d] * f16_to_f32(kr[d]);
        s = warp_sum(s) * scale;
        if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * corr + p;
        const u16* vr = vc + ((u64)j * n_head_kv + kvh) * dv;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            const u32 d = lane + 32 * i;
            if (d < dv) o[i] = o[i] * corr + p * f16_to_f32(vr[d]);
        }
        m = m_new;
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        const u32 d = lane + 32 * i;
        if (d < dv) part_o[warp][d] = o[i];
    }
    __syncthreads();
    float big = neg_inf;
    for (int w = 0; w < ATT_WARPS; w++) big = fmaxf(big, part_m[w]);
    float total = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        if (part_m[w] != neg_inf) total += part_l[w] * expf(part_m[w] - big);
    float* oh = out + ((u64)t * n_head + h) * dv;
    for (u32 d = threadIdx.x; d < dv; d += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (part_m[w] != neg_inf) acc += part_o[w][d] * expf(part_m[w] - big);
        oh[d] = total > 0.0f ? acc / total : 0.0f;
    }
}
