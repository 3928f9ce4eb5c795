//! Element-wise ops: add, add_bias, scale and the gated activations SwiGLU, GeGLU and
//! gpt-oss's clamped SwiGLU.

use super::activation::{self, Gate};
use super::matmul::SharedOut;
use super::{expect_len, OpResult, Weight};
use crate::pool::ChunkRunner;
use prima_abi::backend::TensorView;

/// Elements per pool chunk of a gated activation; shorter inputs (a decode step's
/// activations) run on the calling thread, where the hand-off would cost more than it saves.
const GATE_CHUNK: usize = 16 * 1024;

pub fn add(acc: &mut [f32], x: &[f32]) -> OpResult<()> {
    expect_len("add", "x length", x.len(), acc.len())?;
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
    Ok(())
}

/// Adds `bias` (one F32 row whose length is the row length) to every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &TensorView<'_>) -> OpResult<()> {
    let bias = Weight::f32_vector("add_bias", "bias", bias)?;
    if !x.len().is_multiple_of(bias.cols) {
        return Err(format!(
            "add_bias: x length {} is not a multiple of the bias length {}",
            x.len(),
            bias.cols
        ));
    }
    for row in x.chunks_exact_mut(bias.cols) {
        for (i, v) in row.iter_mut().enumerate() {
            *v += bias.f32_at(i);
        }
    }
    Ok(())
}

pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// `gate = silu(gate) · up` (see [`activation`] for the math).
pub fn swiglu(gate: &mut [f32], up: &[f32]) -> OpResult<()> {
    expect_len("swiglu", "up length", up.len(), gate.len())?;
    activation::gate(Gate::Silu, gate, up);
    Ok(())
}

/// `gate = gelu_tanh(gate) · up` (see [`activation`] for the math).
pub fn geglu(gate: &mut [f32], up: &[f32]) -> OpResult<()> {
    expect_len("geglu", "up length", up.len(), gate.len())?;
    activation::gate(Gate::GeluTanh, gate, up);
    Ok(())
}

/// gpt-oss's clamped SwiGLU (`Backend::swiglu_oai`): the host formula of the ABI
/// ([`prima_abi::backend::swiglu_oai_host`]), with libm's `expf` as ggml's CPU backend
/// uses, so its bits are llama.cpp's rather than [`activation::exp`]'s.
pub fn swiglu_oai(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) -> OpResult<()> {
    expect_len("swiglu_oai", "up length", up.len(), gate.len())?;
    prima_abi::backend::swiglu_oai_host(gate, up, alpha, limit);
    Ok(())
}

/// `gate = act(gate) · up` element-wise, split over `pool` for prompt-sized inputs (each
/// element is computed alone, so the split does not change results).
pub fn gated_on(
    pool: &impl ChunkRunner,
    gate: &mut [f32],
    up: &[f32],
    act: impl Fn(&mut [f32], &[f32]) -> OpResult<()> + Sync,
) -> OpResult<()> {
    expect_len("gated activation", "up length", up.len(), gate.len())?;
    if gate.len() < 2 * GATE_CHUNK || pool.threads() < 2 {
        return act(gate, up);
    }
    let n = gate.len();
    let dst = SharedOut(gate.as_mut_ptr());
    pool.run(n.div_ceil(GATE_CHUNK), &|c| {
        let (lo, hi) = (c * GATE_CHUNK, ((c + 1) * GATE_CHUNK).min(n));
        // SAFETY: chunk `c` owns elements `lo .. hi` of `gate`, disjoint per chunk, and `gate`
        // outlives `run`, which returns when every chunk is done.
        let g = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(lo), hi - lo) };
        // Lengths match by construction, so `act` cannot fail here.
        let _ = act(g, &up[lo..hi]);
    });
    Ok(())
}
