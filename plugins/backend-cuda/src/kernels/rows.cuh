// The row kernels every weight format shares: get_rows for all, matmul per kind.
//
// - GET_ROWS(name, QK, BYTES) from the format's `deq_<name>(block, sub, y)`, which decodes
//   the 32 elements of sub-block `sub` to f32.
// - FLOAT_MATMUL(name, QK, BYTES): F32/F16/BF16 weights against f32 activations rounded
//   as the CPU rounds them (`act_<name>`), float products summed in the CPU's order and
//   with its roundings (`term_<name>`: fused for F32, as the CPU's canonical float dot).
// - QUANT_MATMUL(name, F): the quantized formats against activations already quantized
//   once per product (quantize.cu) to the format's 8-bit companion (Q8_0, Q8_1 or Q8_K,
//   as the CPU backend pairs them). `F` gives the integer block arithmetic: `decode` a
//   32-element chunk's weight quants into 8 packed words of signed bytes plus its small
//   integer scales, `partial` the chunk's integer sums against one token (dp4a), and
//   `combine` one block's integer sums with its float scales exactly as the CPU's scalar
//   `vec_dot` does (same operations in the same order, no fused multiply-add). Integer
//   sums are exact in any order, so a block split across lanes gives the CPU's per-block
//   value, and the blocks are added in row order as the CPU adds them: a product is the
//   CPU's bit for bit.

// Tokens each warp multiplies against one weight row: the row's blocks are decoded once
// for all of them.
#define MATMUL_TOKENS 8
// Warps (= rows) per thread block.
#define MATMUL_WARPS 4

// get_rows_<name>: out[r] = dequantize(w row ids[r]); grid (chunks, n_ids), any block size.
#define GET_ROWS(NAME, QK, BYTES)                                                            \
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
    }

// matmul_<name>: out[t][row] = w[row] · x[t]; grid (ceil(rows / MATMUL_WARPS),
// ceil(n_tokens / MATMUL_TOKENS)), block 32 * MATMUL_WARPS; one warp per row.
//
// FLOAT_MATMUL keeps the CPU's summation order (formats/float.rs `DOT_LANES`): element e
// goes to accumulator e % 16 by `term_<name>` (F32: `__fmaf_rn`, one rounding; F16/BF16: a
// multiply, then an add), the 16 are folded by halving; rows are whole 32-element chunks,
// so there is no tail. Each half-warp is those 16 accumulators for every other token.
// `elem_<name>(row, e)` reads one weight element, `act_<name>` rounds an activation as
// the CPU does.
#define FLOAT_MATMUL(NAME, QK, BYTES)                                                        \
    extern "C" __global__ void matmul_##NAME(const u8* w, const float* x, float* out,        \
                                             u32 cols, u32 rows, u64 row_bytes,              \
                                             u32 n_tokens) {                                 \
        const u32 lane = threadIdx.x % 32, half = lane / 16, cl = lane % 16;                 \
        const u32 row = blockIdx.x * MATMUL_WARPS + threadIdx.x / 32;                        \
        const u32 t0 = blockIdx.y * MATMUL_TOKENS;                                           \
        if (row >= rows) return;                                                             \
        const u32 nt = min((u32)MATMUL_TOKENS, n_tokens - t0);                               \
        const u8* wr = w + (u64)row * row_bytes;                                             \
        for (u32 t = half; t < MATMUL_TOKENS; t += 2) {                                      \
            if (t - half >= nt) break;                                                       \
            const bool live = t < nt;                                                        \
            const float* xt = x + (u64)(t0 + (live ? t : 0)) * cols;                         \
            float acc = 0.0f;                                                                \
            if (live)                                                                        \
                for (u32 e = cl; e < cols; e += 16)                                          \
                    acc = term_##NAME(elem_##NAME(wr, e), act_##NAME(xt[e]), acc);           \
            for (u32 o = 8; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);    \
            if (cl == 0 && live) out[(u64)(t0 + t) * rows + row] = acc;                      \
        }                                                                                    \
    }

__device__ __forceinline__ int dot8(const int* w, const int* a) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = dp4a(w[i], a[i], s);
    return s;
}

__device__ __forceinline__ int dot4(const int* w, const int* a) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) s = dp4a(w[i], a[i], s);
    return s;
}

// The quantized activations of a product, as quantize.cu writes them: `q` the signed
// quants (n_tokens × cols), `d` each activation block's scale as the CPU stores it (f16
// rounded for Q8_0/Q8_1, f32 for Q8_K), `s` Q8_1's d·Σq (f16 rounded), `bsums` Q8_K's
// sums of 16 quants. Unused pointers are null.
//
// matmul_q: grid and lanes as FLOAT_MATMUL. A block of QK elements spans QK/32 chunks,
// i.e. QK/32 neighbouring lanes, whose integer sums meet by shuffles before the block's
// first lane combines them.
template <class F>
__device__ __forceinline__ void matmul_q(const u8* w, const i8* q, const float* d, const float* s,
                                         const short* bsums, float* out, u32 cols, u32 rows,
                                         u64 row_bytes, u32 n_tokens) {
    constexpr u32 G = F::QK / 32;
    const u32 lane = threadIdx.x % 32;
    const u32 row = blockIdx.x * MATMUL_WARPS + threadIdx.x / 32;
    const u32 t0 = blockIdx.y * MATMUL_TOKENS;
    if (row >= rows) return;
    const u32 nt = min((u32)MATMUL_TOKENS, n_tokens - t0);
    const u8* wr = w + (u64)row * row_bytes;
    const u32 n_chunks = cols / 32;
    const u32 a_blocks = cols / F::AQK;
    float acc[MATMUL_TOKENS];
#pragma unroll
    for (int t = 0; t < MATMUL_TOKENS; t++) acc[t] = 0.0f;
    // Every lane runs every iteration (the shuffles need the whole warp); a lane past the
    // row's end contributes zeros. G divides 32, so a block's lanes are on or off together.
    for (u32 base = 0; base < n_chunks; base += 32) {
        const u32 c = base + lane;
        const bool on = c < n_chunks;
        const u8* blk = wr + (u64)(c / G) * F::BYTES;
        const int sub = c % G;
        int wq[8], k[4];
        if (on) F::decode(blk, sub, wq, k);
#pragma unroll
        for (u32 t = 0; t < MATMUL_TOKENS; t++) {
            if (t >= nt) break;
            const u64 tok = t0 + t;
            int ip = 0, mp = 0;
            if (on) {
                const int4* a4 = (const int4*)(q + tok * cols + (u64)c * 32);
                const int4 lo = a4[0], hi = a4[1];
                const int a[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                int b0 = 0, b1 = 0;
                if (F::AQK == 256) {
                    b0 = bsums[tok * (cols / 16) + 2 * c];
                    b1 = bsums[tok * (cols / 16) + 2 * c + 1];
                }
                F::partial(wq, k, a, b0, b1, &ip, &mp);
            }
#pragma unroll
            for (u32 o = 1; o < G; o <<= 1) {
                ip += __shfl_xor_sync(0xffffffffu, ip, o);
                mp += __shfl_xor_sync(0xffffffffu, mp, o);
            }
            float v = 0.0f;
            if (on && sub == 0) {
                const u64 ab = tok * a_blocks + (u64)c * 32 / F::AQK;
                v = F::combine(blk, ip, mp, d[ab], s ? s[ab] : 0.0f);
            }
            // The CPU adds a row's blocks one after another: so does every lane here, in
            // block order, so the row's sum is the CPU's bit for bit.
            const u32 here = min(32u, n_chunks - base);
            for (u32 l = 0; l < here; l += G) acc[t] += __shfl_sync(0xffffffffu, v, l);
        }
    }
#pragma unroll
    for (u32 t = 0; t < MATMUL_TOKENS; t++)
        if (lane == 0 && t < nt) out[(u64)(t0 + t) * rows + row] = acc[t];
}

#define QUANT_MATMUL(NAME, F)                                                                \
    extern "C" __global__ void matmul_##NAME(const u8* w, const i8* q, const float* d,       \
                                             const float* s, const short* bsums, float* out, \
                                             u32 cols, u32 rows, u64 row_bytes,              \
                                             u32 n_tokens) {                                 \
        matmul_q<F>(w, q, d, s, bsums, out, cols, rows, row_bytes, n_tokens);                \
    }
