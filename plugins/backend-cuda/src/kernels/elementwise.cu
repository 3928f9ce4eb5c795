// Norms and element-wise operations on f32 activations, with the CPU backend's numerics:
// RMS norm sums squares in f64; SiLU and tanh-GELU are x / (1 + e^-z) with its e^x.

// One block per row; blockDim.x a power of two ≤ 1024.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, u32 n,
                                    float eps) {
    __shared__ double partial[1024];
    const float* xr = x + (u64)blockIdx.x * n;
    float* yr = out + (u64)blockIdx.x * n;
    double s = 0.0;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) s += (double)xr[i] * (double)xr[i];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (u32 o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) partial[threadIdx.x] += partial[threadIdx.x + o];
        __syncthreads();
    }
    const float mean = (float)(partial[0] / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
}

extern "C" __global__ void add(float* acc, const float* x, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        acc[i] += x[i];
}

extern "C" __global__ void add_bias(float* x, const float* bias, u64 n, u32 row) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] += bias[i % row];
}

extern "C" __global__ void scale(float* x, float s, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] *= s;
}

// The CPU backend's own e^x (ops/activation.rs), operation for operation and never fused,
// so SiLU and GELU give its bits: clamp to [−87, 88], x = n·ln2 + r (Cody–Waite), a
// degree-7 Taylor polynomial of e^r, times 2^n from exponent bits.
__device__ __forceinline__ float exp_cpu(float x) {
    const float round = 12582912.0f;  // 1.5 · 2^23
    x = fminf(fmaxf(x, -87.0f), 88.0f);
    const float t = __fadd_rn(__fmul_rn(x, 1.4426950408889634f), round);
    const float n = __fsub_rn(t, round);
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.6933594f)), __fmul_rn(n, -2.1219444e-4f));
    const int n_int = __float_as_int(t) - __float_as_int(round);
    const float two_n = __int_as_float((n_int + 127) << 23);
    float p = 1.0f / 5040.0f;
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 720.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 120.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 24.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 6.0f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    return __fmul_rn(p, two_n);
}

// gate = silu(gate) · up, silu(g) = g / (1 + e^−g).
extern "C" __global__ void swiglu(float* gate, const float* up, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float g = gate[i];
        gate[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, exp_cpu(-g))), up[i]);
    }
}

// gate = gelu_tanh(gate) · up, gelu_tanh(g) = g / (1 + e^−(2√(2/π) g (1 + 0.044715 g²))).
extern "C" __global__ void geglu(float* gate, const float* up, u64 n) {
    const float two_sqrt_2_over_pi = 1.595769f;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float inner = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, g), g));
        const float z = __fmul_rn(__fmul_rn(two_sqrt_2_over_pi, g), inner);
        gate[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, exp_cpu(-z))), up[i]);
    }
}
