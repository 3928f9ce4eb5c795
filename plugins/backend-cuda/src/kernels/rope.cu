// Rotary position embedding, the CPU backend's semantics (ops/rope.rs): theta of pair i
// is pos * base^(-2i/n_rot) accumulated by repeated f32 multiplication, divided by
// freq_factors[i] when given; YaRN mixes the interpolated and extrapolated angles over the
// ramp [corr_low, corr_high] (computed on the host) and scales the magnitude.

// One thread per (token, head, pair); grid-stride over all of them.
extern "C" __global__ void rope(float* x, const u32* positions, u32 n_tokens, u32 n_head,
                                u32 head_dim, u32 n_rot, u32 neox, const float* freq_factors,
                                float theta_scale, float freq_scale, float ext_factor,
                                float attn_factor, float corr_low, float corr_high) {
    const u32 half = n_rot / 2;
    const u64 total = (u64)n_tokens * n_head * half;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (u64)gridDim.x * blockDim.x) {
        const u32 i = idx % half;
        const u64 th = idx / half;  // token * n_head + head
        const u32 t = th / n_head;
        float theta = (float)positions[t];
        for (u32 k = 0; k < i; k++) theta *= theta_scale;
        const float ff = freq_factors ? freq_factors[i] : 1.0f;
        const float theta_extrap = theta / ff;
        const float theta_interp = __fmul_rn(freq_scale, theta_extrap);
        float angle = theta_interp, mscale = attn_factor;
        if (ext_factor != 0.0f) {
            const float y = ((float)i - corr_low) / fmaxf(corr_high - corr_low, 0.001f);
            const float mix = __fmul_rn(1.0f - fminf(fmaxf(y, 0.0f), 1.0f), ext_factor);
            angle = __fadd_rn(__fmul_rn(theta_interp, 1.0f - mix), __fmul_rn(theta_extrap, mix));
            mscale = __fmul_rn(mscale, 1.0f + __fmul_rn(0.1f, logf(1.0f / freq_scale)));
        }
        // cos and sin rounded from double: the correctly rounded values libm's cosf/sinf
        // (the CPU's) return, where CUDA's own are a few ulp off.
        const float c = __fmul_rn((float)cos((double)angle), mscale);
        const float s = __fmul_rn((float)sin((double)angle), mscale);
        float* head = x + th * head_dim;
        const u32 a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = head[a], x1 = head[b];
        head[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        head[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}
