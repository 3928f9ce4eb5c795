// The two kernels every weight format shares, instantiated per format by ROW_KERNELS from
// its `deq_<name>(block, sub, y)`, which decodes the 32 elements of sub-block `sub`.
//
// Phase 1 (host-slice ABI): activations are f32; the weights are read in their stored
// blocks straight from VRAM and decoded in registers. Quantizing the activations once per
// product for integer dot products (dp4a) is the next step.

// Tokens each warp multiplies against one weight row: the row's blocks are decoded once
// for all of them.
#define MATMUL_TOKENS 8
// Warps (= rows) per thread block.
#define MATMUL_WARPS 4

// get_rows_<name>: out[r] = dequantize(w row ids[r]); grid (chunks, n_ids), any block size.
// matmul_<name>: out[t][row] = w[row] · x[t]; grid (ceil(rows / MATMUL_WARPS),
// ceil(n_tokens / MATMUL_TOKENS)), block 32 * MATMUL_WARPS. One warp per row: lane k takes
// 32-element chunks k, k + 32, …, so neighbouring lanes read neighbouring blocks.
#define ROW_KERNELS(NAME, QK, BYTES)                                                         \
    extern "C" __global__ void get_rows_##NAME(const u8* w, const u32* ids, float* out,      \
                                               u32 cols, u64 row_bytes, u32 n_ids) {         \
        const u32 r = blockIdx.y;                                                            \
        if (r >= n_ids) return;                                                              \
        const u8* row = w + (u64)ids[r] * row_bytes;                                         \
        const u32 n_chunks = cols / 32;                                                      \
        for (u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < n_chunks;                    \
             c += gridDim.x * blockDim.x) {                                                  \
            float y[32];                                                                     \
            deq_##NAME(row + (u64)(c / ((QK) / 32)) * (BYTES), c % ((QK) / 32), y);          \
            float* o = out + (u64)r * cols + (u64)c * 32;                                    \
            for (int l = 0; l < 32; l++) o[l] = y[l];                                        \
        }                                                                                    \
    }                                                                                        \
    extern "C" __global__ void matmul_##NAME(const u8* w, const float* x, float* out,        \
                                             u32 cols, u32 rows, u64 row_bytes,              \
                                             u32 n_tokens) {                                 \
        const u32 lane = threadIdx.x % 32;                                                   \
        const u32 row = blockIdx.x * MATMUL_WARPS + threadIdx.x / 32;                        \
        const u32 t0 = blockIdx.y * MATMUL_TOKENS;                                           \
        if (row >= rows) return;                                                             \
        const u32 nt = min((u32)MATMUL_TOKENS, n_tokens - t0);                               \
        const u8* wr = w + (u64)row * row_bytes;                                             \
        float acc[MATMUL_TOKENS];                                                            \
        for (int t = 0; t < MATMUL_TOKENS; t++) acc[t] = 0.0f;                               \
        const u32 n_chunks = cols / 32;                                                      \
        for (u32 c = lane; c < n_chunks; c += 32) {                                          \
            float y[32];                                                                     \
            deq_##NAME(wr + (u64)(c / ((QK) / 32)) * (BYTES), c % ((QK) / 32), y);           \
            _Pragma("unroll") for (u32 t = 0; t < MATMUL_TOKENS; t++) {                      \
                if (t >= nt) break;                                                          \
                const float4* xt = (const float4*)(x + (u64)(t0 + t) * cols + (u64)c * 32);  \
                float s = 0.0f;                                                              \
                _Pragma("unroll") for (int v = 0; v < 8; v++) {                              \
                    const float4 a = xt[v];                                                  \
                    s += y[4 * v] * a.x + y[4 * v + 1] * a.y + y[4 * v + 2] * a.z +          \
                         y[4 * v + 3] * a.w;                                                 \
                }                                                                            \
                acc[t] += s;                                                                 \
            }                                                                                \
        }                                                                                    \
        _Pragma("unroll") for (u32 t = 0; t < MATMUL_TOKENS; t++) {                          \
            const float s = warp_sum(acc[t]);                                                \
            if (lane == 0 && t < nt) out[(u64)(t0 + t) * rows + row] = s;                              \
        }                                                                                    \
    }
