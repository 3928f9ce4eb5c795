//! The gated activations' math: SiLU and tanh-GELU, both as `x / (1 + e^−z)`, and the
//! softmax's exponentials, over an `exp` of our own that the compiler vectorises.
//!
//! Why not libm: `expf`/`tanhf` are scalar calls, and a prompt's GeGLU spent about a fifth
//! of Gemma's prefill in `tanhf` (attention's `expf` cost SmolLM2 F16 pp512 9% at AVX2).
//! Why not a lookup table (llama.cpp's f16 GELU table): it rounds the input to f16 and
//! moved Gemma's logits further from the reference.
//!
//! Numerics contract: only IEEE `+ − × ÷`, min/max and bit moves, never a fused
//! multiply-add, so the AVX2 and AVX-512 instantiations below return the same bits as the
//! portable one (the compiler may widen the loop, it may not contract it). Error against
//! the exact functions: under 2.5e-7 relative for `exp` on its range, about 1e-7 for SiLU
//! and GELU after their division.

use crate::formats::dispatch::{self, KernelLevel};

/// `e^x` for finite `x`, clamped to `[−87, 88]` so `2^n` stays a normal float: Cody–Waite
/// reduction `x = n·ln2 + r` with `|r| ≤ ln2/2`, then a degree-7 Taylor polynomial of `e^r`
/// (truncation error 5e-9) scaled by `2^n` built from its exponent bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n · LN2_HI` is exact for |n| ≤ 127 (LN2_HI has 9 significant bits).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to an integer and leaves that integer in the low bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let n_int = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let two_n = f32::from_bits(((n_int + 127) << 23) as u32);
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    p * two_n
}

/// `x / (1 + e^−x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, computed as `x / (1 + e^−2u)` with
/// `u = √(2/π) (x + 0.044715 x³)` (the same function: `(1 + tanh u) / 2 = 1 / (1 + e^−2u)`).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769;
    x / (1.0 + exp(-(TWO_SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x))))
}

/// `gate[i] = act(gate[i]) · up[i]`; inlined into each instruction-set wrapper below.
#[inline(always)]
fn gate_with(gate: &mut [f32], up: &[f32], act: impl Fn(f32) -> f32) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = act(*g) * u;
    }
}

/// Which activation a gated kernel applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Silu,
    GeluTanh,
}

/// `gate = act(gate) · up` over the shorter of the two slices, with the widest vectors the
/// given level allows (same bits at every level).
pub fn gate_at(level: KernelLevel, act: Gate, gate: &mut [f32], up: &[f32]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        KernelLevel::Avx512 if level.is_available() => {
            // SAFETY: the level is available, so this CPU has AVX-512F (and AVX2).
            unsafe { x86::gate_avx512(act, gate, up) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelLevel::Avx2 | KernelLevel::Avx512 if level.is_available() => {
            // SAFETY: the level is available, so this CPU has AVX2 and FMA.
            unsafe { x86::gate_avx2(act, gate, up) }
        }
        _ => gate_portable(act, gate, up),
    }
}

/// [`gate_at`] with the level `dispatch` selected.
pub fn gate(act: Gate, gate: &mut [f32], up: &[f32]) {
    gate_at(dispatch::selection().level, act, gate, up)
}

/// A softmax in place over scores `scale · xs[i]`: `e^(s_i − max)`, their sum in f64, each
/// times `1 / sum` rounded to f32 (0 where the sum is 0), with the widest vectors the given
/// level allows (same bits at every level).
pub fn softmax_at(level: KernelLevel, xs: &mut [f32], scale: f32) {
    softmax_sink_at(level, xs, scale, None)
}

/// [`softmax_at`] with an attention sink (gpt-oss): a logit `sink` (not scaled) that takes
/// part in the max and adds `e^(sink − max)` to the sum after the scores' own, as ggml's
/// `soft_max` with sinks does, but gets no output of its own.
pub fn softmax_sink_at(level: KernelLevel, xs: &mut [f32], scale: f32, sink: Option<f32>) {
    match level {
        #[cfg(target_arch = "x86_64")]
        KernelLevel::Avx512 if level.is_available() => {
            // SAFETY: the level is available, so this CPU has AVX-512F (and AVX2).
            unsafe { x86::softmax_avx512(xs, scale, sink) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelLevel::Avx2 | KernelLevel::Avx512 if level.is_available() => {
            // SAFETY: the level is available, so this CPU has AVX2 and FMA.
            unsafe { x86::softmax_avx2(xs, scale, sink) }
        }
        _ => softmax_portable(xs, scale, sink),
    }
}

/// [`softmax_at`] with the level `dispatch` selected.
pub fn softmax(xs: &mut [f32], scale: f32) {
    softmax_at(dispatch::selection().level, xs, scale)
}

/// [`softmax_sink_at`] with the level `dispatch` selected.
pub fn softmax_sink(xs: &mut [f32], scale: f32, sink: Option<f32>) {
    softmax_sink_at(dispatch::selection().level, xs, scale, sink)
}

/// Lanes of the softmax's max and sum: element `i` goes to lane `i % 8`, so both are
/// element-wise vector operations the compiler keeps in registers, where one running value
/// was a chain of dependent scalar operations.
const LANES: usize = 8;

/// `xs` folded into [`LANES`] lanes by `f`, each lane starting from `init`.
#[inline(always)]
fn fold_lanes<T: Copy>(xs: &[f32], init: T, f: impl Fn(T, f32) -> T) -> [T; LANES] {
    let mut lanes = [init; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l = f(*l, x);
        }
    }
    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *l = f(*l, x);
    }
    lanes
}

/// The one softmax of every level: the max is order-free, and the f64 sum's lanes fold in
/// a fixed order, so every vector width gives the same bits.
#[inline(always)]
fn softmax_portable(xs: &mut [f32], scale: f32, sink: Option<f32>) {
    for x in xs.iter_mut() {
        *x *= scale;
    }
    let top = fold_lanes(xs, f32::NEG_INFINITY, |m, x| if x > m { x } else { m });
    let mut max = top.into_iter().fold(f32::NEG_INFINITY, f32::max);
    if let Some(sink) = sink {
        max = max.max(sink);
    }
    for x in xs.iter_mut() {
        *x = exp(*x - max);
    }
    let [a, b, c, d, e, f, g, h] = fold_lanes(xs, 0.0f64, |s, x| s + x as f64);
    let mut total = ((a + e) + (c + g)) + ((b + f) + (d + h));
    if let Some(sink) = sink {
        total += f64::from(exp(sink - max));
    }
    let norm = if total > 0.0 {
        (1.0 / total) as f32
    } else {
        0.0
    };
    for x in xs.iter_mut() {
        *x *= norm;
    }
}

/// The one loop of every level; each wrapper below inlines it under its target features.
#[inline(always)]
fn gate_portable(act: Gate, gate: &mut [f32], up: &[f32]) {
    match act {
        Gate::Silu => gate_with(gate, up, silu),
        Gate::GeluTanh => gate_with(gate, up, gelu_tanh),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{gate_portable, softmax_portable, Gate};

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gate_avx2(act: Gate, gate: &mut [f32], up: &[f32]) {
        gate_portable(act, gate, up)
    }

    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn gate_avx512(act: Gate, gate: &mut [f32], up: &[f32]) {
        gate_portable(act, gate, up)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax_avx2(xs: &mut [f32], scale: f32, sink: Option<f32>) {
        softmax_portable(xs, scale, sink)
    }

    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn softmax_avx512(xs: &mut [f32], scale: f32, sink: Option<f32>) {
        softmax_portable(xs, scale, sink)
    }
}
