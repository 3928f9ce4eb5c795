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

ROW_KERNELS(q2_k, 256, 84)
ROW_KERNELS(q3_k, 256, 110)
ROW_KERNELS(q4_k, 256, 144)
ROW_KERNELS(q5_k, 256, 176)
ROW_KERNELS(q6_k, 256, 210)
