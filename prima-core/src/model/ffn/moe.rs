//! The mixture-of-experts feed-forward block (`qwen3moe`, `gpt-oss`), computed as
//! llama.cpp's `build_moe_ffn` computes it:
//!
//! 1. router logits `ffn_gate_inp · h` (plus `ffn_gate_inp.bias` when the experts carry
//!    biases) for every row, one product over the batch;
//! 2. per row, the gating ([`ExpertGating`]): a softmax over all experts and the `k`
//!    largest probabilities kept (largest first), or the `k` largest logits kept and a
//!    softmax over those; then, when the architecture says so, divided by their sum;
//! 3. per expert, the rows routed to it gathered into one batch and run through its
//!    gated MLP — three products (each followed by the expert's bias row, when it has
//!    biases), so each expert's weights are read once per step whatever the number of its
//!    rows; experts no row chose are not read at all;
//! 4. each row's output is the sum of its `k` experts' outputs times their weights,
//!    added in the order of step 2 (weight 0's term first), as llama.cpp adds them.
//!
//! Expert `e`'s matrices are the `e`-th slab of the 3-D tensors `ffn_{gate,up,down}_exps`
//! (`[n_embd, n_ff_exp, n_expert]`, `[n_ff_exp, n_embd, n_expert]`): a view of
//! consecutive rows of the mapping ([`Model::expert_view`]), never a copy.
//!
//! The products, the gathering of rows and the weighted sum are the backend's, on its
//! buffers; only the router's logits come to the host (one counted download per layer),
//! where routing — a softmax over a few dozen logits per row, its sum in f64 as in ggml —
//! picks the experts. The weighted sum multiplies, then adds, in choice order. A single token is the batch of one: the same code, one gathered
//! row per chosen expert. Every row's result is the one it gets alone, since the
//! backend's products are row by row.

use abi_stable::std_types::RSlice;
use prima_abi::backend::Buf;

use super::{FfnBufs, FfnContext};
use crate::gguf::TensorInfo;
use crate::model::arch::ExpertGating;
use crate::model::backend_call::{download, op};
use crate::model::{ExpertParams, ModelError};

/// A layer's experts and their router.
#[derive(Debug, Clone)]
pub struct MoeFfn {
    /// `ffn_gate_inp`: `[n_embd, n_expert]`, one row of router weights per expert.
    pub router: TensorInfo,
    /// `ffn_gate_exps`, `ffn_up_exps`: `[n_embd, n_ff_exp, n_expert]`.
    pub gate_exps: TensorInfo,
    pub up_exps: TensorInfo,
    /// `ffn_down_exps`: `[n_ff_exp, n_embd, n_expert]`.
    pub down_exps: TensorInfo,
    pub shape: ExpertParams,
    pub gating: ExpertGating,
    /// Divide each row's kept probabilities by their sum.
    pub normalize_weights: bool,
    /// The router's and the experts' biases (gpt-oss), F32; boxed, so a layer's block is
    /// no larger for them.
    pub biases: Option<Box<ExpertBiases>>,
}

/// A layer's expert biases: the router's, and one row per expert for each matrix.
#[derive(Debug, Clone)]
pub struct ExpertBiases {
    /// `ffn_gate_inp.bias`: `[n_expert]`.
    pub router: TensorInfo,
    /// `ffn_gate_exps.bias`, `ffn_up_exps.bias`: `[n_ff_exp, n_expert]`.
    pub gate: TensorInfo,
    pub up: TensorInfo,
    /// `ffn_down_exps.bias`: `[n_embd, n_expert]`.
    pub down: TensorInfo,
}

/// The experts' buffers on one backend for batches of up to `n_batch` rows.
#[derive(Default)]
pub(crate) struct MoeBufs {
    /// Router logits, `n × n_expert`.
    probs: Buf,
    /// One expert's gathered input rows and their outputs, up to `n × n_embd`.
    rows_in: Buf,
    rows_out: Buf,
    /// Each choice's weighted output, `n × k × n_embd`, row `t·k + j` for row t's j-th
    /// choice.
    terms: Buf,
}

impl MoeBufs {
    pub fn new(
        alloc: &mut impl FnMut(usize) -> Result<Buf, ModelError>,
        n_embd: usize,
        e: ExpertParams,
        n_batch: usize,
    ) -> Result<MoeBufs, ModelError> {
        Ok(MoeBufs {
            probs: alloc(n_batch * e.n_expert)?,
            rows_in: alloc(n_batch * n_embd)?,
            rows_out: alloc(n_batch * n_embd)?,
            terms: alloc(n_batch * e.n_expert_used * n_embd)?,
        })
    }
}

/// The routing, on the host.
#[derive(Default)]
pub(crate) struct MoeHost {
    /// Router logits, then probabilities, `n × n_expert`.
    probs: Vec<f32>,
    /// Per row, its `k` experts and their weights, largest first.
    chosen: Vec<u32>,
    weights: Vec<f32>,
    /// Choices (`t·k + j`) grouped by expert, and where each expert's start.
    by_expert: Vec<u32>,
    start: Vec<usize>,
    /// One expert's source rows and weights, for the gather and the weighted scatter.
    rows: Vec<u32>,
    row_weights: Vec<f32>,
    /// The router's input rows, for an expert policy that reads them.
    input: Vec<f32>,
}

impl MoeHost {
    pub fn new(e: ExpertParams, n_batch: usize) -> MoeHost {
        let choices = n_batch * e.n_expert_used;
        MoeHost {
            probs: vec![0.0; n_batch * e.n_expert],
            chosen: vec![0; choices],
            weights: vec![0.0; choices],
            by_expert: vec![0; choices],
            start: vec![0; e.n_expert + 1],
            rows: Vec::with_capacity(n_batch),
            row_weights: Vec::with_capacity(n_batch),
            input: Vec::new(),
        }
    }
}

impl MoeFfn {
    /// Replaces the `n` rows of `h` (the normed residual stream, `n × n_embd`) by the
    /// weighted sum of their experts' outputs.
    pub(crate) fn forward(
        &self,
        cx: FfnContext<'_>,
        h: Buf,
        n: usize,
        s: &FfnBufs,
        m: &mut MoeHost,
    ) -> Result<(), ModelError> {
        let (be, model) = (cx.be, cx.model);
        let ExpertParams {
            n_expert,
            n_expert_used: k,
            n_ff_exp: ff,
        } = self.shape;
        let d = model.hparams().n_embd;
        if n == 0 {
            return Ok(());
        }
        let b = &s.moe;

        // 1–2. Router on the backend; softmax and top-k per row here.
        let probs_dev = b.probs.head(n * n_expert);
        op(
            be.matmul(model.view(&self.router), h, n as u32, probs_dev),
            "matmul ffn_gate_inp",
        )?;
        let biases = self.biases.as_ref();
        if let Some(bias) = biases {
            op(
                be.add_bias(probs_dev, model.view(&bias.router)),
                "add_bias ffn_gate_inp",
            )?;
        }
        let probs = &mut m.probs[..n * n_expert];
        download(be, probs_dev, probs)?;
        for t in 0..n {
            route(
                &mut probs[t * n_expert..(t + 1) * n_expert],
                self.gating,
                self.normalize_weights,
                &mut m.chosen[t * k..(t + 1) * k],
                &mut m.weights[t * k..(t + 1) * k],
            );
        }
        group_by_expert(&m.chosen[..n * k], &mut m.start, &mut m.by_expert[..n * k]);
        if cx.experts.is_some() {
            // A policy may read the router's input (to guess the next layer's experts).
            m.input.resize(n * d, 0.0);
            download(be, h, &mut m.input)?;
        }
        cx.routed(
            &m.start,
            &m.input[..if cx.experts.is_some() { n * d } else { 0 }],
        );

        // 3. Each chosen expert once, over all its rows; its weighted outputs to their
        // choices' rows of `terms`.
        let terms = b.terms.head(n * k * d);
        for e in 0..n_expert {
            let choices = &m.by_expert[m.start[e]..m.start[e + 1]];
            let c = choices.len();
            if c == 0 {
                continue;
            }
            m.rows.clear();
            m.rows
                .extend(choices.iter().map(|&choice| choice / k as u32));
            m.row_weights.clear();
            m.row_weights
                .extend(choices.iter().map(|&choice| m.weights[choice as usize]));
            let rows_in = b.rows_in.head(c * d);
            op(
                be.gather_rows(h, d as u32, RSlice::from_slice(&m.rows), rows_in),
                "gather_rows experts",
            )?;
            let (gate, up) = (s.gate.head(c * ff), s.up.head(c * ff));
            let ct = c as u32;
            cx.computing(e);
            op(
                be.matmul(model.expert_view(&self.gate_exps, e), rows_in, ct, gate),
                "matmul ffn_gate_exps",
            )?;
            op(
                be.matmul(model.expert_view(&self.up_exps, e), rows_in, ct, up),
                "matmul ffn_up_exps",
            )?;
            if let Some(bias) = biases {
                op(
                    be.add_bias(up, model.row_view(&bias.up, e)),
                    "add_bias ffn_up_exps",
                )?;
                op(
                    be.add_bias(gate, model.row_view(&bias.gate, e)),
                    "add_bias ffn_gate_exps",
                )?;
            }
            cx.gated(gate, up)?;
            let rows_out = b.rows_out.head(c * d);
            op(
                be.matmul(model.expert_view(&self.down_exps, e), gate, ct, rows_out),
                "matmul ffn_down_exps",
            )?;
            if let Some(bias) = biases {
                op(
                    be.add_bias(rows_out, model.row_view(&bias.down, e)),
                    "add_bias ffn_down_exps",
                )?;
            }
            cx.computed(e);
            op(
                be.scatter_scaled(
                    rows_out,
                    d as u32,
                    RSlice::from_slice(choices),
                    RSlice::from_slice(&m.row_weights),
                    terms,
                ),
                "scatter_scaled experts",
            )?;
        }

        // 4. Each row: its terms in choice order.
        op(
            be.sum_groups(terms, d as u32, k as u32, h.head(n * d)),
            "sum_groups experts",
        )
    }
}

/// One row's routing. [`ExpertGating::Softmax`]: `logits` become the softmax over all
/// experts (in place, by [`softmax`]); `chosen` gets the `chosen.len()` most probable
/// experts, most probable first (ties: the lower index), and `weights` their
/// probabilities. [`ExpertGating::SoftmaxOfTopK`]: `chosen` gets the largest logits in
/// that order, and `weights` their softmax. Then the weights are divided by their
/// (f64-summed) total when `normalize`.
pub(crate) fn route(
    logits: &mut [f32],
    gating: ExpertGating,
    normalize: bool,
    chosen: &mut [u32],
    weights: &mut [f32],
) {
    if gating == ExpertGating::Softmax {
        softmax(logits);
    }
    top_k(logits, chosen, weights);
    if gating == ExpertGating::SoftmaxOfTopK {
        softmax(weights);
    }
    if normalize {
        let total = weights.iter().map(|&w| f64::from(w)).sum::<f64>() as f32;
        for w in weights.iter_mut() {
            *w /= total;
        }
    }
}

/// A softmax in place, as ggml's: `exp(x − max)` in f32, their sum in f64, times the sum's
/// f32 reciprocal.
fn softmax(xs: &mut [f32]) {
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for x in xs.iter_mut() {
        *x = (*x - max).exp();
        sum += f64::from(*x);
    }
    let inv = (1.0 / sum) as f32;
    for x in xs.iter_mut() {
        *x *= inv;
    }
}

/// The `chosen.len()` largest of `scores`, largest first (ties: the lower index), into
/// `chosen` and their values into `weights`.
fn top_k(scores: &[f32], chosen: &mut [u32], weights: &mut [f32]) {
    for j in 0..chosen.len() {
        let mut best: Option<usize> = None;
        for (e, &p) in scores.iter().enumerate() {
            let taken = chosen[..j].contains(&(e as u32));
            if !taken && best.is_none_or(|b| p > scores[b]) {
                best = Some(e);
            }
        }
        // `chosen.len()` ≤ the expert count (checked at load), so one is always left.
        let best = best.unwrap_or(0);
        chosen[j] = best as u32;
        weights[j] = scores[best];
    }
}

/// Groups the choices `chosen` (row `t`'s `j`-th expert at `t * k + j`) by expert, a
/// counting sort: expert `e`'s choice indices, in row order, end up in
/// `by_expert[start[e]..start[e + 1]]`.
fn group_by_expert(chosen: &[u32], start: &mut [usize], by_expert: &mut [u32]) {
    start.fill(0);
    for &e in chosen {
        start[e as usize + 1] += 1;
    }
    for e in 1..start.len() {
        start[e] += start[e - 1];
    }
    // `start[e]` walks through expert e's places, then is set back.
    for (i, &e) in chosen.iter().enumerate() {
        by_expert[start[e as usize]] = i as u32;
        start[e as usize] += 1;
    }
    for e in (1..start.len()).rev() {
        start[e] = start[e - 1];
    }
    start[0] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_keeps_the_largest_probabilities_renormalised() {
        let mut logits = [0.5f32, 3.0, -1.0, 2.0, 3.0];
        let (mut chosen, mut weights) = ([0u32; 3], [0f32; 3]);
        route(
            &mut logits,
            ExpertGating::Softmax,
            true,
            &mut chosen,
            &mut weights,
        );
        // The tie between experts 1 and 4 goes to the lower index.
        assert_eq!(chosen, [1, 4, 3]);
        let (e3, e2) = (3.0f64.exp(), 2.0f64.exp());
        let expected = [
            e3 / (2.0 * e3 + e2),
            e3 / (2.0 * e3 + e2),
            e2 / (2.0 * e3 + e2),
        ];
        for (w, x) in weights.iter().zip(expected) {
            assert!((f64::from(*w) - x).abs() < 1e-6, "{weights:?}");
        }
        let total: f32 = logits.iter().sum();
        assert!((total - 1.0).abs() < 1e-6);

        let mut logits = [1.0f32, 0.0];
        let (mut chosen, mut weights) = ([0u32; 1], [0f32; 1]);
        route(
            &mut logits,
            ExpertGating::Softmax,
            false,
            &mut chosen,
            &mut weights,
        );
        assert_eq!(chosen, [0]);
        assert!((f64::from(weights[0]) - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-6);
    }

    #[test]
    fn softmax_of_top_k_weighs_the_largest_logits_alone() {
        let mut logits = [0.5f32, 3.0, -1.0, 2.0];
        let (mut chosen, mut weights) = ([0u32; 2], [0f32; 2]);
        route(
            &mut logits,
            ExpertGating::SoftmaxOfTopK,
            false,
            &mut chosen,
            &mut weights,
        );
        assert_eq!(chosen, [1, 3]);
        let e = (-1.0f64).exp();
        for (w, x) in weights.iter().zip([1.0 / (1.0 + e), e / (1.0 + e)]) {
            assert!((f64::from(*w) - x).abs() < 1e-6, "{weights:?}");
        }
        // The logits themselves are left as they were.
        assert_eq!(logits, [0.5, 3.0, -1.0, 2.0]);
    }

    #[test]
    fn choices_are_grouped_by_expert_in_row_order() {
        // Three rows, two experts each, four experts.
        let chosen = [2u32, 0, 0, 3, 2, 3];
        let (mut start, mut by_expert) = ([9usize; 5], [0u32; 6]);
        group_by_expert(&chosen, &mut start, &mut by_expert);
        assert_eq!(start, [0, 2, 2, 4, 6]);
        assert_eq!(by_expert, [1, 2, 0, 4, 3, 5]);
    }
}
