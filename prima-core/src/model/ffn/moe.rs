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
//! The products are the backend's; routing (a softmax over a few dozen logits per row)
//! and the weighted sum are plain f32 arithmetic here, as in ggml (multiply, then add; the
//! softmax's sum in f64). A single token is the batch of one: the same code, one gathered
//! row per chosen expert. Every row's result is the one it gets alone, since the
//! backend's products are row by row.

use super::{FfnContext, FfnScratch};
use crate::gguf::TensorInfo;
use crate::model::arch::ExpertGating;
use crate::model::backend_call::{op, rm, rs};
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

/// Routing tables and gathered rows for batches of up to `n_batch` rows.
#[derive(Default)]
pub(crate) struct MoeScratch {
    /// Router logits, `n × n_expert`, turned into probabilities in place.
    probs: Vec<f32>,
    /// Row `t`'s chosen experts and their weights, `n × k`, largest weight first.
    chosen: Vec<u32>,
    weights: Vec<f32>,
    /// Choices (`t * k + j`) grouped by expert: those of expert `e` are
    /// `by_expert[start[e]..start[e + 1]]`, rows in order.
    by_expert: Vec<u32>,
    start: Vec<usize>,
    /// One expert's input rows, gathered, and its output rows.
    rows_in: Vec<f32>,
    rows_out: Vec<f32>,
    /// Each choice's weighted output, `n × k × n_embd`, summed per row at the end.
    terms: Vec<f32>,
}

impl MoeScratch {
    pub fn new(n_embd: usize, e: ExpertParams, n_batch: usize) -> MoeScratch {
        let choices = n_batch * e.n_expert_used;
        MoeScratch {
            probs: vec![0.0; n_batch * e.n_expert],
            chosen: vec![0; choices],
            weights: vec![0.0; choices],
            by_expert: vec![0; choices],
            start: vec![0; e.n_expert + 1],
            rows_in: vec![0.0; n_batch * n_embd],
            rows_out: vec![0.0; n_batch * n_embd],
            terms: vec![0.0; choices * n_embd],
        }
    }
}

impl MoeFfn {
    pub(crate) fn forward(
        &self,
        cx: FfnContext<'_>,
        h: &mut [f32],
        n: usize,
        s: &mut FfnScratch,
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
        let m = &mut s.moe;

        // 1–2. Router, softmax, top-k per row.
        let probs = &mut m.probs[..n * n_expert];
        op(
            be.matmul(model.view(&self.router), rs(h), n as u32, rm(probs)),
            "matmul ffn_gate_inp",
        )?;
        let biases = self.biases.as_ref();
        if let Some(b) = biases {
            op(
                be.add_bias(rm(probs), model.view(&b.router)),
                "add_bias ffn_gate_inp",
            )?;
        }
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
        cx.routed(&m.start, &h[..n * d]);

        // 3. Each chosen expert once, over all its rows.
        for e in 0..n_expert {
            let choices = &m.by_expert[m.start[e]..m.start[e + 1]];
            let c = choices.len();
            if c == 0 {
                continue;
            }
            let rows_in = &mut m.rows_in[..c * d];
            for (dst, &choice) in rows_in.chunks_exact_mut(d).zip(choices) {
                let t = choice as usize / k;
                dst.copy_from_slice(&h[t * d..(t + 1) * d]);
            }
            let (gate, up) = (&mut s.gate[..c * ff], &mut s.up[..c * ff]);
            let ct = c as u32;
            cx.computing(e);
            op(
                be.matmul(
                    model.expert_view(&self.gate_exps, e),
                    rs(rows_in),
                    ct,
                    rm(gate),
                ),
                "matmul ffn_gate_exps",
            )?;
            op(
                be.matmul(model.expert_view(&self.up_exps, e), rs(rows_in), ct, rm(up)),
                "matmul ffn_up_exps",
            )?;
            if let Some(b) = biases {
                op(
                    be.add_bias(rm(up), model.row_view(&b.up, e)),
                    "add_bias ffn_up_exps",
                )?;
                op(
                    be.add_bias(rm(gate), model.row_view(&b.gate, e)),
                    "add_bias ffn_gate_exps",
                )?;
            }
            cx.gated(gate, up)?;
            let rows_out = &mut m.rows_out[..c * d];
            op(
                be.matmul(
                    model.expert_view(&self.down_exps, e),
                    rs(gate),
                    ct,
                    rm(rows_out),
                ),
                "matmul ffn_down_exps",
            )?;
            if let Some(b) = biases {
                op(
                    be.add_bias(rm(rows_out), model.row_view(&b.down, e)),
                    "add_bias ffn_down_exps",
                )?;
            }
            cx.computed(e);
            for (row, &choice) in rows_out.chunks_exact(d).zip(choices) {
                let choice = choice as usize;
                let w = m.weights[choice];
                let term = &mut m.terms[choice * d..(choice + 1) * d];
                for (o, &y) in term.iter_mut().zip(row) {
                    *o = y * w;
                }
            }
        }

        // 4. Each row: its terms in choice order.
        for (t, out) in h.chunks_exact_mut(d).take(n).enumerate() {
            let terms = &m.terms[t * k * d..(t + 1) * k * d];
            out.copy_from_slice(&terms[..d]);
            for term in terms.chunks_exact(d).skip(1) {
                for (o, &v) in out.iter_mut().zip(term) {
                    *o += v;
                }
            }
        }
        Ok(())
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
