//! The forward pass: token ids in, logits of the last position out, one backend
//! operation at a time over buffers allocated once per session.

use abi_stable::std_types::{RNone, RResult, RSlice, RSliceMut, RSome, RString};

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
    gate: Vec<f32>,
    up: Vec<f32>,
    positions: Vec<u32>,
    logits: Vec<f32>,
}

impl Scratch {
    fn new(hp: &HyperParams, n_batch: usize) -> Scratch {
        Scratch {
            x: vec![0.0; n_batch * hp.n_embd],
            h: vec![0.0; n_batch * hp.n_embd],
            q: vec![0.0; n_batch * hp.q_dim()],
            k: vec![0.0; n_batch * hp.k_dim()],
            v: vec![0.0; n_batch * hp.v_dim()],
            attn: vec![0.0; n_batch * hp.n_head * hp.head_dim_v],
            gate: vec![0.0; n_batch * hp.n_ff],
            up: vec![0.0; n_batch * hp.n_ff],
            positions: vec![0; n_batch],
            logits: vec![0.0; hp.n_vocab],
        }
    }
}

/// One conversation's state on one backend: the KV cache and the position in it.
pub struct Session<'m> {
    model: &'m Model,
    backend: &'m BackendBox,
    kv: u64,
    n_ctx: usize,
    n_batch: usize,
    n_past: usize,
    buf: Scratch,
}

impl<'m> Session<'m> {
    /// Allocates a KV cache of `n_ctx` positions and buffers for batches of `n_batch` tokens.
    pub fn new(
        model: &'m Model,
        backend: &'m BackendBox,
        n_ctx: usize,
        n_batch: usize,
    ) -> Result<Session<'m>, ModelError> {
        model.check_backend(backend)?;
        let hp = model.hparams();
        let spec = KvSpec {
            n_layers: hp.n_layers as u32,
            n_ctx: n_ctx as u32,
            n_head_kv: hp.n_head_kv as u32,
            head_dim_k: hp.head_dim_k as u32,
            head_dim_v: hp.head_dim_v as u32,
        };
        let kv = match backend.kv_create(spec) {
            RResult::ROk(kv) => kv,
            RResult::RErr(message) => {
                return Err(ModelError::Backend {
                    op: "kv_create",
                    message: message.into_string(),
                })
            }
        };
        let n_batch = n_batch.clamp(1, n_ctx.max(1));
        Ok(Session {
            model,
            backend,
            kv,
            n_ctx,
            n_batch,
            n_past: 0,
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

    /// Forgets every position from `n` on, so generation can resume from there.
    pub fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        let n = n.min(self.n_past);
        op(self.backend.kv_truncate(self.kv, n as u32), "kv_truncate")?;
        self.n_past = n;
        Ok(())
    }

    /// Runs `tokens` through the model after the positions already cached and returns the
    /// logits of the last one. Long inputs are processed in batches of `n_batch`.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
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
        let Some(last_chunk_len) = tokens.chunks(self.n_batch).last().map(<[u32]>::len) else {
            return Ok(&self.buf.logits);
        };
        for chunk in tokens.chunks(self.n_batch) {
            self.embed(chunk)?;
            for layer in 0..hp.n_layers {
                self.layer(layer, chunk.len())?;
            }
            self.n_past += chunk.len();
        }
        self.output(last_chunk_len - 1)?;
        Ok(&self.buf.logits)
    }

    /// Looks up the embeddings of `tokens` into the residual stream and sets their positions.
    fn embed(&mut self, tokens: &[u32]) -> Result<(), ModelError> {
        let d = self.model.hparams().n_embd;
        let n = tokens.len();
        for (i, p) in self.buf.positions[..n].iter_mut().enumerate() {
            *p = (self.n_past + i) as u32;
        }
        let table = self.model.view(&self.model.token_embd);
        op(
            self.backend.get_rows(
                table,
                RSlice::from_slice(tokens),
                rm(&mut self.buf.x[..n * d]),
            ),
            "get_rows",
        )
    }

    fn rope_params(&self) -> RopeParams<'m> {
        let hp = self.model.hparams();
        let (freq_scale, ext_factor, n_ctx_orig) = match hp.rope_scaling {
            RopeScaling::None => (1.0, 0.0, hp.n_ctx_train as u32),
            RopeScaling::Linear { factor } => (1.0 / factor, 0.0, hp.n_ctx_train as u32),
            RopeScaling::Yarn {
                factor,
                original_context,
            } => (1.0 / factor, 1.0, original_context),
        };
        RopeParams {
            n_rot: hp.n_rot as u32,
            freq_base: hp.rope_freq_base,
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

    /// One decoder layer over the `n` tokens in the residual stream.
    fn layer(&mut self, il: usize, n: usize) -> Result<(), ModelError> {
        let model = self.model;
        let hp = model.hparams();
        let w = &model.layers[il];
        let be = self.backend;
        let (kv, start_pos) = (self.kv, self.n_past as u32);
        let rope = self.rope_params();
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
        let pos = RSlice::from_slice(&b.positions[..n]);
        let hd = hp.head_dim_k as u32;
        op(be.rope(rm(q), hp.n_head as u32, hd, pos, rope), "rope q")?;
        op(be.rope(rm(k), hp.n_head_kv as u32, hd, pos, rope), "rope k")?;
        let params = AttentionParams {
            layer: il as u32,
            n_tokens: nt,
            start_pos,
            n_head: hp.n_head as u32,
            n_head_kv: hp.n_head_kv as u32,
            head_dim_k: hp.head_dim_k as u32,
            head_dim_v: hp.head_dim_v as u32,
            scale: 1.0 / (hp.head_dim_k as f32).sqrt(),
            sliding_window: 0,
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
        op(be.add(rm(x), rs(h)), "add")?;

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
        op(be.swiglu(rm(gate), rs(up)), "swiglu")?;
        op(
            be.matmul(model.view(&w.ffn_down), rs(gate), nt, rm(h)),
            "matmul ffn_down",
        )?;
        op(be.add(rm(x), rs(h)), "add")
    }

    /// Final norm and output head for row `row` of the residual stream.
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

impl Drop for Session<'_> {
    fn drop(&mut self) {
        self.backend.kv_drop(self.kv);
    }
}
