// The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. Element j of a block and
// element j + 16 share byte j of the quants (low and high nibble).

// Q4_0: f16 d, 16 bytes of nibbles; x = (q - 8) d.
__device__ __forceinline__ void deq_q4_0(const u8* b, int sub, float* y) {
    const float d = ld_f16(b);
    const u8* qs = b + 2;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((int)(qs[j] & 15) - 8) * d;
        y[j + 16] = (float)((int)(qs[j] >> 4) - 8) * d;
    }
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles; x = q d + m.
__device__ __forceinline__ void deq_q4_1(const u8* b, int sub, float* y) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    const u8* qs = b + 4;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 15) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

// Q5_0: f16 d, 32 high bits, 16 bytes of nibbles; x = (q - 16) d.
__device__ __forceinline__ void deq_q5_0(const u8* b, int sub, float* y) {
    const float d = ld_f16(b);
    const u32 qh = ld_u32(b + 2);
    const u8* qs = b + 6;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (float)(((qs[j] & 15) | h0) - 16) * d;
        y[j + 16] = (float)(((qs[j] >> 4) | h1) - 16) * d;
    }
}

// Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of nibbles; x = q d + m.
__device__ __forceinline__ void deq_q5_1(const u8* b, int sub, float* y) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    const u32 qh = ld_u32(b + 4);
    const u8* qs = b + 8;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (float)((qs[j] & 15) | h0) * d + m;
        y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
    }
}

// Q8_0: f16 d, 32 signed bytes; x = q d.
__device__ __forceinline__ void deq_q8_0(const u8* b, int sub, float* y) {
    const float d = ld_f16(b);
    const i8* qs = (const i8*)(b + 2);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

ROW_KERNELS(q4_0, 32, 18)
ROW_KERNELS(q4_1, 32, 20)
ROW_KERNELS(q5_0, 32, 22)
ROW_KERNELS(q5_1, 32, 24)
ROW_KERNELS(q8_0, 32, 34)
