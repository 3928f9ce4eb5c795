//! A session's activation buffers: on each backend it runs layers on, the buffers its
//! operations read and write (backend-owned, [`Buf`]); on the host, the few values the
//! engine itself reads (the residual stream when it leaves for the network, logits,
//! routing). Allocated once per session for batches of up to `n_batch` rows.

use prima_abi::backend::{BackendBox, Buf};

use super::backend_call::alloc;
use super::ffn::FfnBufs;
use super::{Model, ModelError};

/// One backend's buffers.
pub(super) struct DeviceScratch {
    /// Residual stream, `n × n_embd`.
    pub x: Buf,
    /// Normed input / projection output, `n × n_embd`.
    pub h: Buf,
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
    pub attn: Buf,
    /// Per-head normed queries and keys (empty without Q/K norms).
    pub q_normed: Buf,
    pub k_normed: Buf,
    /// Post-normed block output, `n × n_embd` (empty without post-norms).
    pub post: Buf,
    /// The feed-forward block's own buffers.
    pub ffn: FfnBufs,
    /// Every buffer allocated, to free.
    ids: Vec<u64>,
}

impl DeviceScratch {
    /// Allocates every buffer on `be`; on a failure, frees what it had allocated.
    pub fn new(
        be: &BackendBox,
        model: &Model,
        n_batch: usize,
    ) -> Result<DeviceScratch, ModelError> {
        let mut ids = Vec::new();
        match DeviceScratch::alloc_all(be, model, n_batch, &mut ids) {
            Ok(scratch) => Ok(DeviceScratch { ids, ..scratch }),
            Err(e) => {
                ids.into_iter().for_each(|id| be.buf_drop(id));
                Err(e)
            }
        }
    }

    fn alloc_all(
        be: &BackendBox,
        model: &Model,
        n_batch: usize,
        ids: &mut Vec<u64>,
    ) -> Result<DeviceScratch, ModelError> {
        let hp = model.hparams();
        let spec = hp.arch.spec();
        let sized = |wanted: bool, len: usize| if wanted { len } else { 0 };
        let mut a = |len: usize| alloc(be, len, ids);
        Ok(DeviceScratch {
            x: a(n_batch * hp.n_embd)?,
            h: a(n_batch * hp.n_embd)?,
            q: a(n_batch * hp.q_dim())?,
            k: a(n_batch * hp.k_dim())?,
            v: a(n_batch * hp.v_dim())?,
            attn: a(n_batch * hp.n_head * hp.head_dim_v)?,
            q_normed: a(sized(spec.qk_norm, n_batch * hp.q_dim()))?,
            k_normed: a(sized(spec.qk_norm, n_batch * hp.k_dim()))?,
            post: a(sized(spec.post_norms, n_batch * hp.n_embd))?,
            ffn: FfnBufs::new(&mut a, hp, model.experts(), n_batch)?,
            ids: Vec::new(),
        })
    }

    /// Frees the buffers on `be`, the backend that made them.
    pub fn free(&mut self, be: &BackendBox) {
        for id in self.ids.drain(..) {
            be.buf_drop(id);
        }
    }
}

/// The output head's buffer on the session's own backend: logits, grown to the most rows
/// asked for at once.
pub(super) struct OutputBufs {
    /// Logits, `logit_rows × n_vocab`.
    pub logits: Buf,
    pub logit_rows: usize,
    ids: Vec<u64>,
}

impl OutputBufs {
    pub fn new(be: &BackendBox, model: &Model) -> Result<OutputBufs, ModelError> {
        let mut ids = Vec::new();
        let logits = alloc(be, model.hparams().n_vocab, &mut ids)?;
        Ok(OutputBufs {
            logits,
            logit_rows: 1,
            ids,
        })
    }

    /// Logits for `n` rows at once: the buffer, regrown when it holds fewer.
    pub fn logits_for(
        &mut self,
        be: &BackendBox,
        n: usize,
        n_vocab: usize,
    ) -> Result<Buf, ModelError> {
        if n > self.logit_rows {
            if let Some(pos) = self.ids.iter().position(|&id| id == self.logits.id) {
                be.buf_drop(self.ids.swap_remove(pos));
            }
            self.logits = alloc(be, n * n_vocab, &mut self.ids)?;
            self.logit_rows = n;
        }
        Ok(self.logits.head(n * n_vocab))
    }

    pub fn free(&mut self, be: &BackendBox) {
        for id in self.ids.drain(..) {
            be.buf_drop(id);
        }
    }
}

/// Where the batch's residual stream is now: on the host (received from the network or
/// read out for it) or in one side's `x` buffer. It moves only when it must, and every
/// move is one counted upload or download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Residual {
    Host,
    Device(Side),
}

/// Which of a session's backends runs a held layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// The session's own backend (the CPU's).
    Main,
    /// The GPU backend beside it.
    Gpu,
}
