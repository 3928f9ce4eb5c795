// The 256-element super-block formats (Q2_K … Q6_K). `sub` picks the 32-element
// sub-block; element i = 32 sub + l of the super-block is decoded exactly as the CPU
// backend's scalar `quant`/`scales` functions do (formats/k_quants/*.rs, the oracle).

// Q2_K: scales[16] (4-bit scale | 4-bit min), qs[64] (2-bit), f16 d, f16 dmin.
__device__ __forceinline__ void deq_q2_k(const u8* b, int sub, float* y) {
    const float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
    const u8* qs = b + 16;
    const int h = sub / 4, s = sub % 4;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int i = 32 * sub + l;
        const u8 sc = b[i / 16];
        const int q = (qs[32 * h + l] >> (2 * s)) & 3;
        y[l] = d * (float)(sc & 15) * (float)q - dmin * (float)(sc >> 4);
    }
}

// Q3_K: hmask[32], qs[64] (2-bit), 12 bytes of 6-bit signed scales, f16 d.
__device__ __forceinline__ void deq_q3_k(const u8* b, int sub, float* y) {
    const u8* qs = b + 32;
    const u8* packed = b + 96;
    const float d = ld_f16(b + 108);
    const int h = sub / 4, s = sub % 4;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int i = 32 * sub + l;
        const int j = i / 16;
        const int low = (packed[j % 8] >> (4 * (j / 8))) & 15;
        const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        const int scale = (low | (high << 4)) - 32;
        int q = (qs[32 * h + l] >> (2 * s)) & 3;
        if (((b[l] >> sub) & 1) == 0) q -= 4;
        y[l] = d * (float)scale * (float)q;
    }
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (12 packed bytes).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K: f16 d, f16 dmin, 12 scale bytes, qs[128] (4-bit); x = d sc q - dmin m.
__device__ __forceinline__ void deq_q4_k(const u8* b, int sub, float* y) {
    const float d = ld_f16(b), dmin = ld_f16(b + 2);
    int sc, mn;
    scale_min_k4(sub, b + 4, &sc, &mn);
    const float dl = d * (float)sc, ml = dmin * (float)mn;
    const u8* qs = b + 16 + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
#pragma unroll
    for (int l = 0; l < 32; l++) y[l] = dl * (float)((qs[l] >> shift) & 15) - ml;
}

// Q5_K: as Q4_K with a fifth bit per element in qh[32].
__device__ __forceinline__ void deq_q5_k(const u8* b, int sub, float* y) {
    const float d = ld_f16(b), dmin = ld_f16(b + 2);
    int sc, mn;
    scale_min_k4(sub, b + 4, &sc, &mn);
    const float dl = d * (float)sc, ml = dmin * (float)mn;
    const u8* qh = b + 16;
    const u8* qs = b + 48 + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int q = ((qs[l] >> shift) & 15) | (((qh[l] >> sub) & 1) << 4);
        y[l] = dl * (float)q - ml;
    }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 signed 8-bit scales, f16 d.
__device__ __forceinline__ void deq_q6_k(const u8* b, int sub, float* y) {
    const float d = ld_f16(b + 208);
    const i8* scales = (const i8*)(b + 192);
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int i = 32 * sub + l;
        const int h = i / 128, r = i % 128;
        const int low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 15;
        const int high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
        y[l] = d * (float)scales[i / 16] * (float)((low | (high << 4)) - 32);
    }
}

GET_ROWS(q2_k, 256, 84)
GET_ROWS(q3_k, 256, 110)
GET_ROWS(q4_k, 256, 144)
GET_ROWS(q5_k, 256, 176)
GET_ROWS(q6_k, 256, 210)

// Integer dot products against Q8_K activations, for matmul_q (rows.cuh). Chunk `sub` is
// elements 32 sub … 32 sub + 31 of the super-block (wq[j]: 4j … 4j + 3 of the chunk), i.e.
// 16-element groups 2 sub and 2 sub + 1; b0, b1 are the activation's sums of those groups.
// `partial` gives the chunk's share of the CPU's `isum` (Σ scale · group dot) and `msum`
// (Σ min · bsums); `combine` is the CPU's formula (formats/k_quants/*.rs `vec_dot`).

// The signed 6-bit scale j of a Q3_K block (12 packed bytes).
__device__ __forceinline__ int q3_k_scale(const u8* packed, int j) {
    const int low = (packed[j % 8] >> (4 * (j / 8))) & 15;
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (low | (high << 4)) - 32;
}

struct dot_q2_k {
    static constexpr u32 QK = 256, BYTES = 84, AQK = 256;
    static __device__ __forceinline__ void decode(const u8* b, int sub, int* wq, int* k) {
        const u8* qs = b + 16 + 32 * (sub / 4);
        const int shift = 2 * (sub % 4);
#pragma unroll
        for (int j = 0; j < 8; j++) wq[j] = (int)((ld_u32_a4(qs + 4 * j) >> shift) & 0x03030303u);
        const u8 s0 = b[2 * sub], s1 = b[2 * sub + 1];
        k[0] = s0 & 15;
        k[1] = s1 & 15;
        k[2] = s0 >> 4;
        k[3] = s1 >> 4;
    }
    static __device__ __forceinline__ void partial(const int* wq, const int* k, const int* a,
                                                   int b0, int b1, int* ip, int* mp) {
        *ip = k[0] * dot4(wq, a) + k[1] * dot4(wq + 4, a + 4);
        *mp = k[2] * b0 + k[3] * b1;
    }
    // sum += d_a · d · isum − d_a · dmin · msum
    static __device__ __forceinline__ float combine(const u8* b, int ip, int mp, float da, float) {
        return __fsub_rn(__fmul_rn(__fmul_rn(da, ld_f16(b + 80)), (float)ip),
                         __fmul_rn(__fmul_rn(da, ld_f16(b + 82)), (float)mp));
    }
};

struct dot_q3_k {
    static constexpr u32 QK = 256, BYTES = 110, AQK = 256;
    static __device__ __forceinline__ void decode(const u8* b, int sub, int* wq, int* k) {
        const u8* qs = b + 32 + 32 * (sub / 4);
        const int shift = 2 * (sub % 4);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const u32 low = (ld_u32_a2(qs + 4 * j) >> shift) & 0x03030303u;
            const u32 high = (ld_u32_a2(b + 4 * j) >> sub) & 0x01010101u;
            wq[j] = sub_bytes(low | (high << 2), 4);
        }
        k[0] = q3_k_scale(b + 96, 2 * sub);
        k[1] = q3_k_scale(b + 96, 2 * sub + 1);
    }
    static __device__ __forceinline__ void partial(const int* wq, const int* k, const int* a, int,
                                                   int, int* ip, int*) {
        *ip = k[0] * dot4(wq, a) + k[1] * dot4(wq + 4, a + 4);
    }
    // sum += d_a · d · isum
    static __device__ __forceinline__ float combine(const u8* b, int ip, int, float da, float) {
        return __fmul_rn(__fmul_rn(da, ld_f16(b + 108)), (float)ip);
    }
};

struct dot_q4_k {
    static constexpr u32 QK = 256, BYTES = 144, AQK = 256;
    static __device__ __forceinline__ void decode(const u8* b, int sub, int* wq, int* k) {
        const u8* qs = b + 16 + 32 * (sub / 2);
        const int shift = 4 * (sub % 2);
#pragma unroll
        for (int j = 0; j < 8; j++) wq[j] = (int)((ld_u32_a4(qs + 4 * j) >> shift) & 0x0f0f0f0fu);
        scale_min_k4(sub, b + 4, &k[0], &k[1]);
    }
    static __device__ __forceinline__ void partial(const int* wq, const int* k, const int* a,
                                                   int b0, int b1, int* ip, int* mp) {
        *ip = k[0] * dot8(wq, a);
        *mp = k[1] * (b0 + b1);
    }
    // sum += d_a · d · isum − d_a · dmin · msum
    static __device__ __forceinline__ float combine(const u8* b, int ip, int mp, float da, float) {
        return __fsub_rn(__fmul_rn(__fmul_rn(da, ld_f16(b)), (float)ip),
                         __fmul_rn(__fmul_rn(da, ld_f16(b + 2)), (float)mp));
    }
};

struct dot_q5_k {
    static constexpr u32 QK = 256, BYTES = 176, AQK = 256;
    static __device__ __forceinline__ void decode(const u8* b, int sub, int* wq, int* k) {
        const u8* qs = b + 48 + 32 * (sub / 2);
        const int shift = 4 * (sub % 2);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const u32 low = (ld_u32_a4(qs + 4 * j) >> shift) & 0x0f0f0f0fu;
            const u32 high = (ld_u32_a4(b + 16 + 4 * j) >> sub) & 0x01010101u;
            wq[j] = (int)(low | (high << 4));
        }
        scale_min_k4(sub, b + 4, &k[0], &k[1]);
    }
    static __device__ __forceinline__ void partial(const int* wq, const int* k, const int* a,
                                                   int b0, int b1, int* ip, int* mp) {
        *ip = k[0] * dot8(wq, a);
        *mp = k[1] * (b0 + b1);
    }
    // sum += d_a · d · isum − d_a · dmin · msum
    static __device__ __forceinline__ float combine(const u8* b, int ip, int mp, float da, float) {
        return __fsub_rn(__fmul_rn(__fmul_rn(da, ld_f16(b)), (float)ip),
                         __fmul_rn(__fmul_rn(da, ld_f16(b + 2)), (float)mp));
    }
};

struct dot_q6_k {
    static constexpr u32 QK = 256, BYTES = 210, AQK = 256;
    static __device__ __forceinline__ void decode(const u8* b, int sub, int* wq, int* k) {
        const int h = sub / 4, r = sub % 4;
        const u8* ql = b + 64 * h + 32 * (r % 2);
        const u8* qh = b + 128 + 32 * h;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const u32 low = (ld_u32_a2(ql + 4 * j) >> (4 * (r / 2))) & 0x0f0f0f0fu;
            const u32 high = (ld_u32_a2(qh + 4 * j) >> (2 * r)) & 0x03030303u;
            wq[j] = sub_bytes(low | (high << 4), 32);
        }
        const i8* scales = (const i8*)(b + 192);
        k[0] = scales[2 * sub];
        k[1] = scales[2 * sub + 1];
    }
    static __device__ __forceinline__ void partial(const int* wq, const int* k, const int* a, int,
                                                   int, int* ip, int*) {
        *ip = k[0] * dot4(wq, a) + k[1] * dot4(wq + 4, a + 4);
    }
    // sum += d_a · d · isum
    static __device__ __forceinline__ float combine(const u8* b, int ip, int, float da, float) {
        return __fmul_rn(__fmul_rn(da, ld_f16(b + 208)), (float)ip);
    }
};

QUANT_MATMUL(q2_k, dot_q2_k)
QUANT_MATMUL(q3_k, dot_q3_k)
QUANT_MATMUL(q4_k, dot_q4_k)
QUANT_MATMUL(q5_k, dot_q5_k)
QUANT_MATMUL(q6_k, dot_q6_k)
