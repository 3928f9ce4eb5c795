// F32, F16 and BF16 weights: a "block" here is a chunk of 32 consecutive elements, so the
// shared row kernels (rows.cuh) need rows of a multiple of 32 elements. Float products,
// as the CPU backend computes them (formats/float.rs).
#define F32_QK 32
#define F32_BYTES 128
#define F16_QK 32
#define F16_BYTES 64
#define BF16_QK 32
#define BF16_BYTES 64

__device__ __forceinline__ void deq_f32(const u8* b, int sub, float* y) {
    const float* f = (const float*)b;
#pragma unroll
    for (int l = 0; l < 32; l++) y[l] = f[l];
}

__device__ __forceinline__ void deq_f16(const u8* b, int sub, float* y) {
    const u16* h = (const u16*)b;
#pragma unroll
    for (int l = 0; l < 32; l++) y[l] = f16_to_f32(h[l]);
}

__device__ __forceinline__ void deq_bf16(const u8* b, int sub, float* y) {
    const u16* h = (const u16*)b;
#pragma unroll
    for (int l = 0; l < 32; l++) y[l] = bf16_to_f32(h[l]);
}

// Activations as the CPU multiplies them: f32 as is, rounded to F16 for F16 weights and to
// BF16 for BF16 weights (so each product is exact in f32, as on the CPU).
__device__ __forceinline__ float act_f32(float x) { return x; }
__device__ __forceinline__ float act_f16(float x) { return round_f16(x); }
__device__ __forceinline__ float act_bf16(float x) { return round_bf16(x); }

// One product added to an accumulator as the CPU's canonical float dot adds it
// (formats/float.rs `DOT_LANES`): fused for F32; a product, then a sum (never contracted:
// `_rn` intrinsics) for F16 and BF16, whose exact products round alike either way.
__device__ __forceinline__ float term_f32(float w, float x, float acc) {
    return __fmaf_rn(w, x, acc);
}
__device__ __forceinline__ float term_f16(float w, float x, float acc) {
    return __fadd_rn(acc, __fmul_rn(w, x));
}
__device__ __forceinline__ float term_bf16(float w, float x, float acc) {
    return __fadd_rn(acc, __fmul_rn(w, x));
}

__device__ __forceinline__ float elem_f32(const u8* row, u32 e) { return ((const float*)row)[e]; }
__device__ __forceinline__ float elem_f16(const u8* row, u32 e) {
    return f16_to_f32(((const u16*)row)[e]);
}
__device__ __forceinline__ float elem_bf16(const u8* row, u32 e) {
    return bf16_to_f32(((const u16*)row)[e]);
}

GET_ROWS(f32, F32_QK, F32_BYTES)
GET_ROWS(f16, F16_QK, F16_BYTES)
GET_ROWS(bf16, BF16_QK, BF16_BYTES)
FLOAT_MATMUL(f32, F32_QK, F32_BYTES)
FLOAT_MATMUL(f16, F16_QK, F16_BYTES)
FLOAT_MATMUL(bf16, BF16_QK, BF16_BYTES)
