// F32, F16 and BF16 weights: a "block" here is a chunk of 32 consecutive elements, so the
// shared row kernels (rows.cuh) need rows of a multiple of 32 elements.
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

ROW_KERNELS(f32, F32_QK, F32_BYTES)
ROW_KERNELS(f16, F16_QK, F16_BYTES)
ROW_KERNELS(bf16, BF16_QK, BF16_BYTES)
