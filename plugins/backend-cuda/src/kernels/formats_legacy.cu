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

GET_ROWS(q4_0, 32, 18)
GET_ROWS(q4_1, 32, 20)
GET_ROWS(q5_0, 32, 22)
GET_ROWS(q5_1, 32, 24)
GET_ROWS(q8_0, 32, 34)

// Integer dot products against Q8_0 (Q4_0, Q5_0, Q8_0) or Q8_1 (Q4_1, Q5_1) activations,
// for matmul_q (rows.cuh). A chunk is the whole block: wq[j] holds elements 4j … 4j + 3.
// `combine` is the CPU's formula (formats/q*.rs `vec_dot`), operation for operation.

// The 5th bits of four elements (bits 0–3 of `h`) moved to bit 4 of four bytes.
__device__ __forceinline__ u32 spread_bit4(u32 h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

struct dot_q4_0 {
    static constexpr u32 QK = 32, BYTES = 18, AQK = 32;
    static __device__ __forceinline__ void decode(const u8* b, int, int* wq, int*) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 v = ld_u32_a2(b + 2 + 4 * j);
            wq[j] = sub_bytes(v & 0x0f0f0f0fu, 8);
            wq[j + 4] = sub_bytes((v >> 4) & 0x0f0f0f0fu, 8);
        }
    }
    static __device__ __forceinline__ void partial(const int* wq, const int*, const int* a, int,
                                                   int, int* ip, int*) {
        *ip = dot8(wq, a);
    }
    // sum += isum · d · d_a
    static __device__ __forceinline__ float combine(const u8* b, int ip, int, float da, float) {
        return __fmul_rn(__fmul_rn((float)ip, ld_f16(b)), da);
    }
};

struct dot_q5_0 {
    static constexpr u32 QK = 32, BYTES = 22, AQK = 32;
    static __device__ __forceinline__ void decode(const u8* b, int, int* wq, int*) {
        const u32 qh = ld_u32_a2(b + 2);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 v = ld_u32_a2(b + 6 + 4 * j);
            wq[j] = sub_bytes((v & 0x0f0f0f0fu) | spread_bit4(qh >> (4 * j)), 16);
            wq[j + 4] = sub_bytes(((v >> 4) & 0x0f0f0f0fu) | spread_bit4(qh >> (16 + 4 * j)), 16);
        }
    }
    static __device__ __forceinline__ void partial(const int* wq, const int*, const int* a, int,
                                                   int, int* ip, int*) {
        *ip = dot8(wq, a);
    }
    // sum += isum · d · d_a
    static __device__ __forceinline__ float combine(const u8* b, int ip, int, float da, float) {
        return __fmul_rn(__fmul_rn((float)ip, ld_f16(b)), da);
    }
};

struct dot_q8_0 {
    static constexpr u32 QK = 32, BYTES = 34, AQK = 32;
    static __device__ __forceinline__ void decode(const u8* b, int, int* wq, int*) {
#pragma unroll
        for (int j = 0; j < 8; j++) wq[j] = (int)ld_u32_a2(b + 2 + 4 * j);
    }
    static __device__ __forceinline__ void partial(const int* wq, const int*, const int* a, int,
                                                   int, int* ip, int*) {
        *ip = dot8(wq, a);
    }
    // sum += isum · (d · d_a)
    static __device__ __forceinline__ float combine(const u8* b, int ip, int, float da, float) {
        return __fmul_rn((float)ip, __fmul_rn(ld_f16(b), da));
    }
};

struct dot_q4_1 {
    static constexpr u32 QK = 32, BYTES = 20, AQK = 32;
    static __device__ __forceinline__ void decode(const u8* b, int, int* wq, int*) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 v = ld_u32_a4(b + 4 + 4 * j);
            wq[j] = (int)(v & 0x0f0f0f0fu);
            wq[j + 4] = (int)((v >> 4) & 0x0f0f0f0fu);
        }
    }
    static __device__ __forceinline__ void partial(const int* wq, const int*, const int* a, int,
                                                   int, int* ip, int*) {
        *ip = dot8(wq, a);
    }
    // sum += d · d_a · isum + m · s_a
    static __device__ __forceinline__ float combine(const u8* b, int ip, int, float da, float sa) {
        return __fadd_rn(__fmul_rn(__fmul_rn(ld_f16(b), da), (float)ip),
                         __fmul_rn(ld_f16(b + 2), sa));
    }
};

struct dot_q5_1 {
    static constexpr u32 QK = 32, BYTES = 24, AQK = 32;
    static __device__ __forceinline__ void decode(const u8* b, int, int* wq, int*) {
        const u32 qh = ld_u32_a4(b + 4);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 v = ld_u32_a4(b + 8 + 4 * j);
            wq[j] = (int)((v & 0x0f0f0f0fu) | spread_bit4(qh >> (4 * j)));
            wq[j + 4] = (int)(((v >> 4) & 0x0f0f0f0fu) | spread_bit4(qh >> (16 + 4 * j)));
        }
    }
    static __device__ __forceinline__ void partial(const int* wq, const int*, const int* a, int,
                                                   int, int* ip, int*) {
        *ip = dot8(wq, a);
    }
    // sum += d · d_a · isum + m · s_a
    static __device__ __forceinline__ float combine(const u8* b, int ip, int, float da, float sa) {
        return __fadd_rn(__fmul_rn(__fmul_rn(ld_f16(b), da), (float)ip),
                         __fmul_rn(ld_f16(b + 2), sa));
    }
};

QUANT_MATMUL(q4_0, dot_q4_0)
QUANT_MATMUL(q4_1, dot_q4_1)
QUANT_MATMUL(q5_0, dot_q5_0)
QUANT_MATMUL(q5_1, dot_q5_1)
QUANT_MATMUL(q8_0, dot_q8_0)
