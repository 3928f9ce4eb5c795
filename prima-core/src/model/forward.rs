//! The forward pass: token ids in, logits of the last position out, one backend
//! operation at a time over buffers allocated once per session.

use abi_stable::std_types::{RNone, RResult, RSlice, RSliceMut, RSome, RString};

use super::arch::{AttentionScale, FfnActivation};
use super::{HyperParams, Model, ModelError, RopeScaling};
use crate::plugin::backend_abi::{AttentionParams, BackendBox, KvSpec, RopeParams};

/// Turns a backend result into a model error that names the operation.
fn op(result: RResult<(), RString>, name: &'static str) -> Result<(), ModelError> {
    match result {
        RResult::ROk(()) => Ok(()),
        RResult::RErr(message) => Err(ModelError::Backend {
            op: name,
            message: message.into_string(),
        }),
    }
}

fn rs(v: &[f32]) -> RSlice<'_, f32> {
    RSlice::from_slice(v)
}

fn rm(v: &mut [f32]) -> RSliceMut<'_, f32> {
    RSliceMut::from_mut_slice(v)
}

/// Activation buffers sized for `n_batch` tokens, reused by every step.
struct Scratch {
    /// Residual stream, `n × n_embd`.
    x: Vec<f32>,
    /// Normed input / projection output, `n × n_embd`.
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    /// Per-head normed queries and keys (empty without Q/K norms).
    q_normed: Vec<f32>,
    k_normed: Vec<f32>,
    /// Post-normed block output, `n × n_embd` (empty without post-norms).
    post: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    positions: Vec<u32>,
    logits: Vec<f32>,
}

impl Scratch {
    fn new(hp: &HyperParams, n_batch: usize) -> Scratch {
        let spec = hp.arch.spec();
        let sized = |wanted: bool, len: usize| if wanted { vec![0.0; len] } else { Vec::new() };
        Scratch {
            x: vec![0.0; n_batch * hp.n_embd],
            h: vec![0.0; n_batch * hp.n_embd],
            q: vec![0.0; n_batch * hp.q_dim()],
            k: vec![0.0; n_batch * hp.k_dim()],
            v: vec![0.0; n_batch * hp.v_dim()],
            attn: vec![0.0; n_batch * hp.n_head * hp.head_dim_v],
            q_normed: sized(spec.qk_norm, n_batch * hp.q_dim()),
            k_normed: sized(spec.qk_norm, n_batch * hp.k_dim()),
            post: sized(spec.post_norms, n_batch * hp.n_embd),
            gate: vec![0.0; n_batch * hp.n_ff],
            up: vec![0.0; n_batch * hp.n_ff],
            positions: vec![0; n_batch],
            logits: vec![0.0; hp.n_vocab],
        }
    }
}

/// One conversation's state on one backend: the KV cache of the layers this session holds
/// and the position in it.
///
/// A single-device session holds every layer and is driven by [`Session::eval`]. A ring
/// device holds only its windows' layers and is driven step by step: [`Session::begin_batch`],
/// then [`Session::embed`] (head) or [`Session::hidden_mut`] (received activations), then
/// [`Session::run_layers`] per window, then [`Session::finish_batch`].
pub struct Session<'m> {
    model: &'m Model,
    backend: &'m BackendBox,
    /// The backend's KV cache; none when the session holds no layer (a ring head whose
    /// plan gives it only the embedding and the output head).
    kv: Option<u64>,
    /// KV-cache slot of each model layer, `None` for layers held elsewhere.
    kv_slots: Vec<Option<u32>>,
    n_ctx: usize,
    n_batch: usize,
    n_past: usize,
    /// The batch in flight: its first position and token count.
    batch_start: usize,
    batch_len: usize,
    buf: Scratch,
}

impl<'m> Session<'m> {
    /// Allocates a KV cache of `n_ctx` positions for every layer and buffers for batches of
    /// `n_batch` tokens.
    pub fn new(
        model: &'m Model,
        backend: &'m BackendBox,
        n_ctx: usize,
        n_batch: usize,
    ) -> Result<Session<'m>, ModelError> {
        let all: Vec<usize> = (0..model.hparams().n_layers).collect();
        Session::with_layers(model, backend, n_ctx, n_batch, &all)
    }

    /// Like [`Session::new`], but with a KV cache for `layers` only (a ring device's share).
    pub fn with_layers(
        model: &'m Model,
        backend: &'m BackendBox,
        n_ctx: usize,
        n_batch: usize,
        layers: &[usize],
    ) -> Result<Session<'m>, ModelError> {
        model.check_backend(backend)?;
        let hp = model.hparams();
        let mut kv_slots = vec![None; hp.n_layers];
        let mut held = 0u32;
        for &l in layers {
            let Some(slot) = kv_slots.get_mut(l) else {
                return Err(ModelError::LayerNotHeld {
                    layer: l,
                    held: format!("the model has {} layers", hp.n_layers),
                });
            };
            if slot.is_none() {
                *slot = Some(held);
                held += 1;
            }
        }
        let spec = KvSpec {
            n_layers: held,
            n_ctx: n_ctx as u32,
            n_head_kv: hp.n_head_kv as u32,
            head_dim_k: hp.head_dim_k as u32,
            head_dim_v: hp.head_dim_v as u32,
        };
        let kv = if held == 0 {
            None
        } else {
            match backend.kv_create(spec) {
                RResult::ROk(kv) => Some(kv),
                RResult::RErr(message) => {
                    return Err(ModelError::Backend {
                        op: "kv_create",
                        message: message.into_string(),
                    })
                }
            }
        };
        let n_batch = n_batch.clamp(1, n_ctx.max(1));
        Ok(Session {
            model,
            backend,
            kv,
            kv_slots,
            n_ctx,
            n_batch,
            n_past: 0,
            batch_start: 0,
            batch_len: 0,
            buf: Scratch::new(hp, n_batch),
        })
    }

    /// Positions already in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Largest number of tokens one batch may hold.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Forgets every position from `n` on, so generation can resume from there.
    pub fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        let n = n.min(self.n_past);
        if let Some(kv) = self.kv {
            op(self.backend.kv_truncate(kv, n as u32), "kv_truncate")?;
        }
        self.n_past = n;
        Ok(())
    }

    /// Runs `tokens` through the model after the positions already cached and returns the
    /// logits of the last one. Long inputs are processed in batches of `n_batch`.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        let n_layers = self.model.hparams().n_layers;
        self.check_fits(tokens)?;
        let Some(last_chunk_len) = tokens.chunks(self.n_batch).last().map(<[u32]>::len) else {
            return Ok(&self.buf.logits);
        };
        for chunk in tokens.chunks(self.n_batch) {
            self.begin_batch(self.n_past, chunk.len())?;
            self.embed(chunk)?;
            self.run_layers(0..n_layers)?;
            self.finish_batch();
        }
        self.logits(last_chunk_len - 1)
    }

    /// Fails when `tokens` would overflow the context or hold an id outside the vocabulary.
    pub fn check_fits(&self, tokens: &[u32]) -> Result<(), ModelError> {
        let hp = self.model.hparams();
        if self.n_past + tokens.len() > self.n_ctx {
            return Err(ModelError::ContextFull {
                needed: self.n_past + tokens.len(),
                n_ctx: self.n_ctx,
            });
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= hp.n_vocab) {
            return Err(ModelError::TokenOutOfRange {
                id,
                vocab: hp.n_vocab,
            });
        }
        Ok(())
    }

    /// Starts a batch of `n` tokens at position `start`. Cached positions from `start` on
    /// are forgotten first (a new request that shares only a prefix with the old one).
    pub fn begin_batch(&mut self, start: usize, n: usize) -> Result<(), ModelError> {
        if n > self.n_batch {
            return Err(ModelError::BatchTooLarge {
                n,
                n_batch: self.n_batch,
            });
        }
        if start > self.n_past {
            return Err(ModelError::PositionGap {
                start,
                n_past: self.n_past,
            });
        }
        if start + n > self.n_ctx {
            return Err(ModelError::ContextFull {
                needed: start + n,
                n_ctx: self.n_ctx,
            });
        }
        if start < self.n_past {
            self.truncate(start)?;
        }
        for (i, p) in self.buf.positions[..n].iter_mut().enumerate() {
            *p = (start + i) as u32;
        }
        self.batch_start = start;
        self.batch_len = n;
        Ok(())
    }

    /// The residual stream of the batch in flight, `n × n_embd`.
    pub fn hidden(&self) -> &[f32] {
        &self.buf.x[..self.batch_len * self.model.hparams().n_embd]
    }

    /// The residual stream to fill with activations received from the previous device.
    pub fn hidden_mut(&mut self) -> &mut [f32] {
        let len = self.batch_len * self.model.hparams().n_embd;
        &mut self.buf.x[..len]
    }

    /// Tells the backend that no operation follows soon, so it frees the cores (a ring
    /// device between its window and the next round).
    pub fn idle(&self) {
        self.backend.idle();
    }

    /// Runs the layers `layers` over the batch in flight (all must be held).
    pub fn run_layers(&mut self, layers: std::ops::Range<usize>) -> Result<(), ModelError> {
        for il in layers {
            let Some(slot) = self.kv_slots.get(il).copied().flatten() else {
                return Err(ModelError::LayerNotHeld {
                    layer: il,
                    held: self.held_layers(),
                });
            };
            self.layer(il, slot)?;
        }
        Ok(())
    }

    /// Marks the batch in flight as cached.
    pub fn finish_batch(&mut self) {
        self.n_past = self.batch_start + self.batch_len;
        self.batch_len = 0;
    }

    fn held_layers(&self) -> String {
        let held: Vec<String> = (0..self.kv_slots.len())
            .filter(|&l| self.kv_slots[l].is_some())
            .map(|l| l.to_string())
            .collect();
        if held.is_empty() {
            "no layers".to_string()
        } else {
            format!("layers {}", held.join(","))
        }
    }

    /// Final norm and output head for row `row` of the residual stream of the last batch.
    pub fn logits(&mut self, row: usize) -> Result<&[f32], ModelError> {
        self.output(row)?;
        Ok(&self.buf.logits)
    }

    /// Logits of rows `rows` of the last batch, one row of `n_vocab` after another into
    /// `out`, with the output head applied to all of them in one product (its weights are
    /// read once, not once per row). The caller owns `out`, so the per-token path still
    /// allocates nothing.
    pub fn logits_rows(
        &mut self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let hp = self.model.hparams();
        let (d, n) = (hp.n_embd, rows.len());
        // The last batch began at `batch_start` and ended at `n_past`.
        let last_len = self.n_past.saturating_sub(self.batch_start);
        if rows.end > last_len || n > self.n_batch {
            return Err(ModelError::RowsOutOfBatch {
                rows: format!("{}..{}", rows.start, rows.end),
                batch: last_len,
                n_batch: self.n_batch,
            });
        }
        if out.len() != n * hp.n_vocab {
            return Err(ModelError::OutputSize {
                len: out.len(),
                needed: n * hp.n_vocab,
            });
        }
        if n == 0 {
            return Ok(());
        }
        let (model, be, b) = (self.model, self.backend, &mut self.buf);
        let (x, h) = (&b.x[rows.start * d..rows.end * d], &mut b.h[..n * d]);
        op(
            be.rms_norm(rs(x), model.view(&model.output_norm), hp.rms_eps, rm(h)),
            "rms_norm",
        )?;
        op(
            be.matmul(model.view(&model.output), rs(h), n as u32, rm(out)),
            "matmul output",
        )
    }

    /// Looks up the embeddings of the batch's `tokens` into the residual stream.
    pub fn embed(&mut self, tokens: &[u32]) -> Result<(), ModelError> {
        let d = self.model.hparams().n_embd;
        let n = tokens.len();
        if n != self.batch_len {
            return Err(ModelError::BatchTooLarge {
                n,
                n_batch: self.batch_len,
            });
        }
        let table = self.model.view(&self.model.token_embd);
        let x = &mut self.buf.x[..n * d];
        op(
            self.backend
                .get_rows(table, RSlice::from_slice(tokens), rm(x)),
            "get_rows",
        )?;
        if self.model.hparams().arch.spec().scale_embeddings {
            op(
                self.backend.scale(rm(x), (d as f32).sqrt()),
                "scale embeddings",
            )?;
        }
        Ok(())
    }

    /// RoPE of layer `il`. Local (sliding-window) layers use their own base and no
    /// position scaling, as llama.cpp's `rope_freq_*_train_swa` defaults.
    fn rope_params(&self, il: usize) -> RopeParams<'m> {
        let hp = self.model.hparams();
        let local = hp.is_local(il);
        let scaling = if local {
            RopeScaling::None
        } else {
            hp.rope_scaling
        };
        let (freq_scale, ext_factor, n_ctx_orig) = match scaling {
            RopeScaling::None => (1.0, 0.0, hp.n_ctx_train as u32),
            RopeScaling::Linear { factor } => (1.0 / factor, 0.0, hp.n_ctx_train as u32),
            RopeScaling::Yarn {
                factor,
                original_context,
            } => (1.0 / factor, 1.0, original_context),
        };
        RopeParams {
            n_rot: hp.n_rot as u32,
            freq_base: if local {
                hp.rope_freq_base_local
            } else {
                hp.rope_freq_base
            },
            freq_scale,
            neox: hp.arch.spec().rope_neox,
            freq_factors: match &self.model.rope_freqs {
                Some(f) => RSome(RSlice::from_slice(f)),
                None => RNone,
            },
            ext_factor,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig,
        }
    }

    /// One decoder layer over the batch in the residual stream; its keys and values go to
    /// KV-cache slot `slot`.
    fn layer(&mut self, il: usize, slot: u32) -> Result<(), ModelError> {
        let model = self.model;
        let hp = model.hparams();
        let w = &model.layers[il];
        let be = self.backend;
        // A layer is only run when it has a slot, so the cache exists.
        let kv = self.kv.unwrap_or_default();
        let (start_pos, n) = (self.batch_start as u32, self.batch_len);
        let spec = hp.arch.spec();
        let rope = self.rope_params(il);
        let b = &mut self.buf;
        let (d, qd, kd, vd, ff) = (hp.n_embd, hp.q_dim(), hp.k_dim(), hp.v_dim(), hp.n_ff);
        let attn_dim = hp.n_head * hp.head_dim_v;
        let nt = n as u32;

        // Attention block.
        let (x, h) = (&mut b.x[..n * d], &mut b.h[..n * d]);
        op(
            be.rms_norm(rs(x), model.view(&w.attn_norm), hp.rms_eps, rm(h)),
            "rms_norm",
        )?;
        let (q, k, v) = (&mut b.q[..n * qd], &mut b.k[..n * kd], &mut b.v[..n * vd]);
        op(
            be.matmul(model.view(&w.wq), rs(h), nt, rm(q)),
            "matmul attn_q",
        )?;
        op(
            be.matmul(model.view(&w.wk), rs(h), nt, rm(k)),
            "matmul attn_k",
        )?;
        op(
            be.matmul(model.view(&w.wv), rs(h), nt, rm(v)),
            "matmul attn_v",
        )?;
        for (bias, out) in [(&w.bq, &mut *q), (&w.bk, &mut *k), (&w.bv, &mut *v)] {
            if let Some(bias) = bias {
                op(be.add_bias(rm(out), model.view(bias)), "add_bias")?;
            }
        }
        // Per-head Q/K norm: the norm weight is one head long, so each head is a row.
        let (q, k) = match (&w.attn_q_norm, &w.attn_k_norm) {
            (Some(qn), Some(kn)) => {
                let (q_out, k_out) = (&mut b.q_normed[..n * qd], &mut b.k_normed[..n * kd]);
                op(
                    be.rms_norm(rs(q), model.view(qn), hp.rms_eps, rm(q_out)),
                    "rms_norm attn_q_norm",
                )?;
                op(
                    be.rms_norm(rs(k), model.view(kn), hp.rms_eps, rm(k_out)),
                    "rms_norm attn_k_norm",
                )?;
                (q_out, k_out)
            }
            _ => (q, k),
        };
        let pos = RSlice::from_slice(&b.positions[..n]);
        let hd = hp.head_dim_k as u32;
        op(be.rope(rm(q), hp.n_head as u32, hd, pos, rope), "rope q")?;
        op(be.rope(rm(k), hp.n_head_kv as u32, hd, pos, rope), "rope k")?;
        let scale = match spec.attention_scale {
            AttentionScale::InvSqrtHeadDim => hp.attention_scale,
            AttentionScale::Gemma3QueryPreAttn => {
                op(be.scale(rm(q), hp.attention_scale), "scale q")?;
                1.0
            }
        };
        let params = AttentionParams {
            layer: slot,
            n_tokens: nt,
            start_pos,
            n_head: hp.n_head as u32,
            n_head_kv: hp.n_head_kv as u32,
            head_dim_k: hp.head_dim_k as u32,
            head_dim_v: hp.head_dim_v as u32,
            scale,
            sliding_window: if hp.is_local(il) {
                hp.sliding_window as u32
            } else {
                0
            },
            softcap: 0.0,
        };
        let attn = &mut b.attn[..n * attn_dim];
        op(
            be.attention(kv, rs(q), rs(k), rs(v), params, rm(attn)),
            "attention",
        )?;
        op(
            be.matmul(model.view(&w.wo), rs(attn), nt, rm(h)),
            "matmul attn_output",
        )?;
        add_residual(be, model, &w.attn_post_norm, hp.rms_eps, x, h, &mut b.post)?;

        // Feed-forward block.
        op(
            be.rms_norm(rs(x), model.view(&w.ffn_norm), hp.rms_eps, rm(h)),
            "rms_norm",
        )?;
        let (gate, up) = (&mut b.gate[..n * ff], &mut b.up[..n * ff]);
        op(
            be.matmul(model.view(&w.ffn_gate), rs(h), nt, rm(gate)),
            "matmul ffn_gate",
        )?;
        op(
            be.matmul(model.view(&w.ffn_up), rs(h), nt, rm(up)),
            "matmul ffn_up",
        )?;
        match spec.ffn {
            FfnActivation::Silu => op(be.swiglu(rm(gate), rs(up)), "swiglu")?,
            FfnActivation::GeluTanh => op(be.geglu(rm(gate), rs(up)), "geglu")?,
        }
        op(
            be.matmul(model.view(&w.ffn_down), rs(gate), nt, rm(h)),
            "matmul ffn_down",
        )?;
        add_residual(be, model, &w.ffn_post_norm, hp.rms_eps, x, h, &mut b.post)
    }

    fn output(&mut self, row: usize) -> Result<(), ModelError> {
        let model = self.model;
        let hp = model.hparams();
        let d = hp.n_embd;
        let be = self.backend;
        let b = &mut self.buf;
        let (x, h) = (&b.x[row * d..(row + 1) * d], &mut b.h[..d]);
        op(
            be.rms_norm(rs(x), model.view(&model.output_norm), hp.rms_eps, rm(h)),
            "rms_norm",
        )?;
        op(
            be.matmul(model.view(&model.output), rs(h), 1, rm(&mut b.logits)),
            "matmul output",
        )
    }
}

/// `x += post_norm(h)`, or `x += h` without a post-norm.
fn add_residual(
    be: &BackendBox,
    model: &Model,
    post_norm: &Option<crate::gguf::TensorInfo>,
    eps: f32,
    x: &mut [f32],
    h: &[f32],
    post: &mut [f32],
) -> Result<(), ModelError> {
    match post_norm {
        Some(norm) => {
            let post = &mut post[..h.len()];
            op(
                be.rms_norm(rs(h), model.view(norm), eps, rm(post)),
                "rms_norm post-norm",
            )?;
            op(be.add(rm(x), rs(post)), "add")
        }
        None => op(be.add(rm(x), rs(h)), "add"),
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if let Some(kv) = self.kv {
            self.backend.kv_drop(kv);
        }
    }
}
