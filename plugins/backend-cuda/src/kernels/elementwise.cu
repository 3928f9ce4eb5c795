// Norms and element-wise operations on f32 activations, with the CPU backend's numerics:
// RMS norm sums squares in f64; SiLU and tanh-GELU are x / (1 + e^-z).

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

extern "C" __global__ void swiglu(float* gate, const float* up, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" __global__ void geglu(float* gate, const float* up, u64 n) {
    const float two_sqrt_2_over_pi = 1.595769f;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-(two_sqrt_2_over_pi * g * (1.0f + 0.044715f * g * g)))) * up[i];
    }
}
