// Activations quantized once per product to the 8-bit companion of the weight format, with
// the CPU backend's rounding (formats/q8_0.rs, q8_1.rs, k_quants/q8_k.rs, the oracle), so
// the quants are the CPU's bit for bit. Each writes `q` (signed quants, element order),
// `d` (each block's scale as the CPU stores it) and the block's sums (`s` or `bsums`).
// x is a whole number of blocks (n_tokens × cols, cols a multiple of the block size).

// Q8_0 / Q8_1 (32 elements): one warp per block, lane l owns element l.
// d = max|x| / 127, q = round(x / d) half away from zero; `s` (Q8_1, may be null) is
// d · Σq. d and s are kept rounded to f16, as the CPU's blocks store them.
__device__ __forceinline__ void quantize_q8_32(const float* x, i8* q, float* d, float* s,
                                               u64 n_blocks) {
    const u64 blk = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (blk >= n_blocks) return;
    const u32 lane = threadIdx.x % 32;
    const float v = x[blk * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const int qi = (int)roundf(__fmul_rn(v, id));
    q[blk * 32 + lane] = (i8)qi;
    const int qsum = warp_sum_int(qi);
    if (lane == 0) {
        d[blk] = round_f16(dd);
        if (s) s[blk] = round_f16(__fmul_rn((float)qsum, dd));
    }
}

// Grid-stride free: grid ceil(n_blocks / 8), block 256 (8 warps).
extern "C" __global__ void quantize_q8_0(const float* x, i8* q, float* d, u64 n_blocks) {
    quantize_q8_32(x, q, d, nullptr, n_blocks);
}

extern "C" __global__ void quantize_q8_1(const float* x, i8* q, float* d, float* s,
                                         u64 n_blocks) {
    quantize_q8_32(x, q, d, s, n_blocks);
}

// Q8_K (256 elements): one warp per block, lane l owns elements 8l … 8l + 7. `max` is the
// first element of largest magnitude, with its sign; iscale = −127 / max,
// q = min(127, round-to-nearest-even(iscale · x)), d = 1 / iscale (f32); bsums[g] = Σ of
// quants 16g … 16g + 15. An all-zero block gets d = 0, q = 0.
// Grid ceil(n_blocks / 8), block 256.
extern "C" __global__ void quantize_q8_k(const float* x, i8* q, float* d, short* bsums,
                                         u64 n_blocks) {
    const u64 blk = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (blk >= n_blocks) return;
    const u32 lane = threadIdx.x % 32;
    const float* xb = x + blk * 256 + 8 * lane;
    float v[8];
    float amax = 0.0f, max = 0.0f;
    int at = 8 * lane;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[i];
        if (fabsf(v[i]) > amax) {
            amax = fabsf(v[i]);
            max = v[i];
            at = 8 * lane + i;
        }
    }
    // Largest magnitude, earliest index on ties (the CPU's strict `>` scan).
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
        const float om = __shfl_xor_sync(0xffffffffu, max, o);
        const int oat = __shfl_xor_sync(0xffffffffu, at, o);
        if (oa > amax || (oa == amax && oat < at)) {
            amax = oa;
            max = om;
            at = oat;
        }
    }
    i8* qb = q + blk * 256 + 8 * lane;
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) qb[i] = 0;
        if (lane % 2 == 0) bsums[blk * 16 + lane / 2] = 0;
        if (lane == 0) d[blk] = 0.0f;
        return;
    }
    const float iscale = -127.0f / max;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int qi = min(127, (int)rintf(__fmul_rn(iscale, v[i])));
        qb[i] = (i8)qi;
        sum += qi;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (lane % 2 == 0) bsums[blk * 16 + lane / 2] = (short)sum;
    if (lane == 0) d[blk] = 1.0f / iscale;
}
