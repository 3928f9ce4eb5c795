// Shared by every kernel source: integer types, half/bfloat16 conversions, byte loads and
// warp reductions. Plain CUDA C: NVRTC compiles it without any toolkit header.
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// Little-endian loads at any byte offset (block fields are not always aligned).
__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return (u16)(p[0] | (p[1] << 8));
}

__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ float ld_f16(const u8* p) {
    return f16_to_f32(ld_u16(p));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Rounds to f16 and back (round to nearest even), as the CPU's F16 activations are.
__device__ __forceinline__ float round_f16(float f) {
    return f16_to_f32(f32_to_f16(f));
}

// Rounds to bf16 and back: nearest even, NaN kept quiet (the `half` crate's rule, which
// the CPU's BF16 activations use).
__device__ __forceinline__ float round_bf16(float f) {
    const u32 x = __float_as_uint(f);
    u32 h;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        h = (x >> 16) | 0x40u;
    } else if ((x & 0x8000u) != 0 && (x & 0x17fffu) != 0) {
        h = (x >> 16) + 1;
    } else {
        h = x >> 16;
    }
    return __uint_as_float(h << 16);
}

// Four signed bytes of `a` times those of `b`, summed into `c` (sm_61+).
__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Each byte of `v` (every one in 0..127) minus `k` (≤ 128), as four signed bytes: the
// set top bits stop borrows from crossing bytes.
__device__ __forceinline__ int sub_bytes(u32 v, u32 k) {
    return (int)(((v | 0x80808080u) - k * 0x01010101u) ^ 0x80808080u);
}

// A little-endian u32 from a 2-byte aligned address (blocks of 18, 22, 34, 110, 210 bytes).
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// A u32 from a 4-byte aligned address.
__device__ __forceinline__ u32 ld_u32_a4(const u8* p) {
    return *(const u32*)p;
}
