//! The forward pass: token ids in, logits of the last position out, one backend
//! operation at a time over buffers allocated once per session. The activations stay in
//! the backend's buffers; the residual stream comes to the host only when it leaves the
//! device (a ring hop) and the logits when they are read.

use abi_stable::std_types::{RNone, RResult, RSlice, RSome};

use super::arch::AttentionScale;
use super::backend_call::{download, op, upload};
use super::batch_plan::{check_entries, check_rows, plan_batches, Piece, SeqSpan, SeqTokens};
use super::ffn::{FfnContext, FfnHost};
use super::scratch::{DeviceScratch, OutputBufs, Residual, Side};
use super::{ExpertPolicy, Model, ModelError, RopeScaling};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, BackendBox, Buf, KvSpec, RopeParams, TransferCounts,
};

/// What the engine itself reads and writes on the host, sized for `n_batch` tokens.
struct HostScratch {
    /// The residual stream when it is on the host ([`Residual::Host`]), `n × n_embd`.
    x: Vec<f32>,
    positions: Vec<u32>,
    /// The logits of one row ([`Session::logits`]).
    logits: Vec<f32>,
    /// Which rows of the residual stream the output head reads ([`Session::entries_logits`]).
    out_rows: Vec<u32>,
    /// The feed-forward blocks' host side (routing).
    ffn: FfnHost,
}

impl HostScratch {
    fn new(model: &Model, n_batch: usize) -> HostScratch {
        let hp = model.hparams();
        HostScratch {
            x: vec![0.0; n_batch * hp.n_embd],
            positions: vec![0; n_batch],
            logits: vec![0.0; hp.n_vocab],
            out_rows: Vec::with_capacity(n_batch),
            ffn: FfnHost::new(model.experts(), n_batch),
        }
    }
}

/// The conversations on one backend: a KV cache per slot for the layers this session
/// holds, and the positions each slot has cached.
///
/// A session holds `n_slots` independent contexts (slots) of `n_ctx` positions each, so
/// its KV memory is `n_slots × n_ctx` positions of its layers. One batch may hold rows of
/// several slots ([`SeqSpan`]s): the matrix products run over all rows at once (each
/// weight read once), RoPE and attention run per span, against that slot's cache at that
/// slot's positions. The single-sequence API ([`Session::eval`], [`Session::n_past`],
/// [`Session::truncate`], [`Session::begin_batch`]) is slot 0's.
///
/// A session may hold a second backend, a GPU's, beside its own (the paper's n_m split):
/// the layers given to it ([`GpuLayers`]) run every operation there and keep their keys and
/// values in its KV cache; the other layers, the embedding and the output head run on the
/// session's backend. Each backend has its own buffers; the residual stream moves between
/// them through the host when the side changes (one download and one upload, counted).
///
/// A single-device session holds every layer and is driven by [`Session::eval`] or
/// [`Session::eval_batch_with`]. A ring device holds only its windows' layers and is
/// driven step by step: [`Session::begin_spans`] (or [`Session::begin_batch`]), then
/// [`Session::embed`] (head) or [`Session::hidden_mut`] (received activations), then
/// [`Session::run_layers`] per window, then [`Session::finish_batch`].
pub struct Session<'m> {
    model: &'m Model,
    backend: &'m BackendBox,
    /// The GPU backend beside `backend`, when some held layers run there.
    gpu: Option<&'m BackendBox>,
    /// The backend's KV cache of each slot; empty when the session holds no layer on it (a
    /// ring head whose plan gives it only the embedding and the output head).
    kv: Vec<u64>,
    /// The GPU backend's KV cache of each slot, for the GPU layers; empty without them.
    kv_gpu: Vec<u64>,
    /// Where each model layer runs and its index in that side's KV caches, `None` for
    /// layers held elsewhere.
    kv_layers: Vec<Option<(Side, u32)>>,
    n_ctx: usize,
    n_batch: usize,
    /// Positions cached, per slot.
    n_past: Vec<usize>,
    /// The batch in flight: each sequence's rows, in row order.
    batch: Vec<SeqSpan>,
    batch_len: usize,
    /// The spans of the last finished batch (what [`Session::logits_rows`] reads).
    last: Vec<SeqSpan>,
    /// The session's own backend's buffers, the GPU's (with GPU layers) and the output
    /// head's (on the session's own backend).
    bufs: DeviceScratch,
    gpu_bufs: Option<DeviceScratch>,
    out: OutputBufs,
    host: HostScratch,
    /// Where the batch's residual stream is, and how many rows it holds.
    residual: Residual,
    residual_rows: usize,
    /// The token ids of a batch of [`Session::eval_batch_with`].
    batch_tokens: Vec<u32>,
    /// Each entry's logits.
    entry_logits: Vec<f32>,
    /// Per entry, the first of its rows in `entry_logits` and how many of its last
    /// tokens have logits there; empty: one row per entry, its last
    /// ([`Session::start_entries`]).
    entry_rows: Vec<(usize, usize)>,
    /// The batch's spans as one attention call takes them, rebuilt each layer.
    attn_spans: Vec<AttentionSpan>,
    /// What the MoE layers tell about the experts they use (expert residency).
    experts: Option<std::sync::Arc<dyn ExpertPolicy + 'm>>,
}

/// A GPU backend and the held layers it runs: the paper's n_m GPU layers of each of the
/// device's windows (prima.cpp's choice, which Halda's l_m^{gpu} assumes: a window's first
/// layers, see `prima_cluster::prp::windows`). Layers not held by the session are an error.
#[derive(Clone, Copy)]
pub struct GpuLayers<'m, 'a> {
    pub backend: &'m BackendBox,
    pub layers: &'a [usize],
}

impl<'m> Session<'m> {
    /// Allocates a KV cache of `n_ctx` positions for every layer and buffers for batches of
    /// `n_batch` tokens: one slot.
    pub fn new(
        model: &'m Model,
        backend: &'m BackendBox,
        n_ctx: usize,
        n_batch: usize,
    ) -> Result<Session<'m>, ModelError> {
        Session::with_slots(model, backend, n_ctx, n_batch, 1)
    }

    /// Like [`Session::new`], with `n_slots` slots of `n_ctx` positions each.
    pub fn with_slots(
        model: &'m Model,
        backend: &'m BackendBox,
        n_ctx: usize,
        n_batch: usize,
        n_slots: usize,
    ) -> Result<Session<'m>, ModelError> {
        let all: Vec<usize> = (0..model.hparams().n_layers).collect();
        Session::with_layers_slots(model, backend, n_ctx, n_batch, n_slots, &all)
    }

    /// Like [`Session::new`], but with a KV cache for `layers` only (a ring device's share).
    pub fn with_layers(
        model: &'m Model,
        backend: &'m BackendBox,
        n_ctx: usize,
        n_batch: usize,
        layers: &[usize],
    ) -> Result<Session<'m>, ModelError> {
        Session::with_layers_slots(model, backend, n_ctx, n_batch, 1, layers)
    }

    /// `n_slots` slots of `n_ctx` positions, each with a KV cache for `layers`.
    pub fn with_layers_slots(
        model: &'m Model,
        backend: &'m BackendBox,
        n_ctx: usize,
        n_batch: usize,
        n_slots: usize,
        layers: &[usize],
    ) -> Result<Session<'m>, ModelError> {
        Session::with_split(model, backend, None, n_ctx, n_batch, n_slots, layers)
    }

    /// Like [`Session::with_layers_slots`], with the layers of `gpu` (all among `layers`)
    /// on its backend: their operations run there and their KV caches live there.
    pub fn with_split(
        model: &'m Model,
        backend: &'m BackendBox,
        gpu: Option<GpuLayers<'m, '_>>,
        n_ctx: usize,
        n_batch: usize,
        n_slots: usize,
        layers: &[usize],
    ) -> Result<Session<'m>, ModelError> {
        model.check_backend(backend)?;
        if n_slots == 0 {
            return Err(ModelError::NoSlots);
        }
        let hp = model.hparams();
        let mut on_gpu = vec![false; hp.n_layers];
        if let Some(gpu) = gpu {
            for &l in gpu.layers {
                match on_gpu.get_mut(l) {
                    Some(flag) if layers.contains(&l) => *flag = true,
                    _ => {
                        return Err(ModelError::LayerNotHeld {
                            layer: l,
                            held: format!(
                                "{} layers; a GPU layer must be one of them",
                                layers.len()
                            ),
                        })
                    }
                }
                check_layer_types(model, gpu.backend, l)?;
            }
        }
        let mut kv_layers = vec![None; hp.n_layers];
        let mut held = [0u32; 2];
        for &l in layers {
            let Some(index) = kv_layers.get_mut(l) else {
                return Err(ModelError::LayerNotHeld {
                    layer: l,
                    held: format!("the model has {} layers", hp.n_layers),
                });
            };
            if index.is_none() {
                let side = if on_gpu[l] { Side::Gpu } else { Side::Main };
                *index = Some((side, held[side as usize]));
                held[side as usize] += 1;
            }
        }
        let n_batch = n_batch.clamp(1, n_ctx.max(1));
        let mut bufs = DeviceScratch::new(backend, model, n_batch)?;
        let gpu_bufs = match gpu {
            Some(g) if !g.layers.is_empty() => {
                match DeviceScratch::new(g.backend, model, n_batch) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        bufs.free(backend);
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
        let out = match OutputBufs::new(backend, model) {
            Ok(o) => o,
            Err(e) => {
                bufs.free(backend);
                if let (Some(mut b), Some(g)) = (gpu_bufs, gpu) {
                    b.free(g.backend);
                }
                return Err(e);
            }
        };
        let mut session = Session {
            model,
            backend,
            gpu: gpu.map(|g| g.backend),
            kv: Vec::with_capacity(n_slots),
            kv_gpu: Vec::new(),
            kv_layers,
            n_ctx,
            n_batch,
            n_past: vec![0; n_slots],
            batch: Vec::with_capacity(n_slots),
            batch_len: 0,
            last: Vec::with_capacity(n_slots),
            bufs,
            gpu_bufs,
            out,
            host: HostScratch::new(model, n_batch),
            residual: Residual::Host,
            residual_rows: 0,
            batch_tokens: Vec::new(),
            entry_logits: Vec::new(),
            entry_rows: Vec::new(),
            attn_spans: Vec::with_capacity(n_slots),
            experts: None,
        };
        for side in [Side::Main, Side::Gpu] {
            let n_layers = held[side as usize];
            if n_layers == 0 {
                continue;
            }
            let spec = KvSpec {
                n_layers,
                n_ctx: n_ctx as u32,
                n_head_kv: hp.n_head_kv as u32,
                head_dim_k: hp.head_dim_k as u32,
                head_dim_v: hp.head_dim_v as u32,
            };
            let be = session.backend_of(side);
            for _ in 0..n_slots {
                match be.kv_create(spec) {
                    // Pushed at once, so that a later failure drops it with the session.
                    RResult::ROk(kv) => session.kv_of_mut(side).push(kv),
                    RResult::RErr(message) => {
                        return Err(ModelError::Backend {
                            op: "kv_create",
                            message: message.into_string(),
                        })
                    }
                }
            }
        }
        Ok(session)
    }

    fn backend_of(&self, side: Side) -> &'m BackendBox {
        match (side, self.gpu) {
            (Side::Gpu, Some(gpu)) => gpu,
            _ => self.backend,
        }
    }

    fn kv_of_mut(&mut self, side: Side) -> &mut Vec<u64> {
        match side {
            Side::Main => &mut self.kv,
            Side::Gpu => &mut self.kv_gpu,
        }
    }

    /// Held layers that run on the GPU backend (the paper's l_m^{gpu}; 0 without one).
    pub fn gpu_layer_count(&self) -> usize {
        self.kv_layers
            .iter()
            .filter(|l| matches!(l, Some((Side::Gpu, _))))
            .count()
    }

    /// Gives the MoE layers an expert residency policy (`None`: none), told each layer's
    /// routing and each expert's end of use. It only hints the page cache: the results
    /// are the same bits with or without it.
    pub fn set_expert_policy(&mut self, policy: Option<std::sync::Arc<dyn ExpertPolicy + 'm>>) {
        self.experts = policy;
    }

    /// Positions slot 0 has cached.
    pub fn n_past(&self) -> usize {
        self.n_past[0]
    }

    /// Positions slot `slot` has cached (0 for a slot the session does not hold).
    pub fn slot_n_past(&self, slot: usize) -> usize {
        self.n_past.get(slot).copied().unwrap_or(0)
    }

    /// Independent contexts held.
    pub fn n_slots(&self) -> usize {
        self.n_past.len()
    }

    /// Positions each slot holds.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Largest number of tokens one batch may hold, all slots together.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Forgets every position of slot 0 from `n` on, so generation can resume from there.
    pub fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        self.truncate_slot(0, n)
    }

    /// Forgets every position of slot `slot` from `n` on.
    pub fn truncate_slot(&mut self, slot: usize, n: usize) -> Result<(), ModelError> {
        let n = n.min(self.known_slot(slot)?);
        if let Some(&kv) = self.kv.get(slot) {
            op(self.backend.kv_truncate(kv, n as u32), "kv_truncate")?;
        }
        if let (Some(gpu), Some(&kv)) = (self.gpu, self.kv_gpu.get(slot)) {
            op(gpu.kv_truncate(kv, n as u32), "kv_truncate")?;
        }
        self.n_past[slot] = n;
        Ok(())
    }

    /// The positions slot `slot` holds, or an error naming a slot that does not exist.
    fn known_slot(&self, slot: usize) -> Result<usize, ModelError> {
        self.n_past
            .get(slot)
            .copied()
            .ok_or(ModelError::UnknownSlot {
                slot,
                n_slots: self.n_past.len(),
            })
    }

    /// Runs `tokens` through the model after the positions slot 0 has cached and returns
    /// the logits of the last one. Long inputs are processed in batches of `n_batch`.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        let n_layers = self.model.hparams().n_layers;
        self.check_fits(tokens)?;
        let Some(last_chunk_len) = tokens.chunks(self.n_batch).last().map(<[u32]>::len) else {
            return Ok(&self.host.logits);
        };
        for chunk in tokens.chunks(self.n_batch) {
            self.begin_batch(self.n_past(), chunk.len())?;
            self.embed(chunk)?;
            self.run_layers(0..n_layers)?;
            self.finish_batch();
        }
        self.logits(last_chunk_len - 1)
    }

    /// Fails when `tokens` would overflow slot 0's context or hold an id outside the
    /// vocabulary.
    pub fn check_fits(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if self.n_past() + tokens.len() > self.n_ctx {
            return Err(ModelError::ContextFull {
                needed: self.n_past() + tokens.len(),
                n_ctx: self.n_ctx,
            });
        }
        self.check_vocab(tokens)
    }

    fn check_vocab(&self, tokens: &[u32]) -> Result<(), ModelError> {
        let vocab = self.model.hparams().n_vocab;
        match tokens.iter().find(|&&id| id as usize >= vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    /// Fails, naming the entry, unless every entry of `seqs` names a slot of this
    /// session, no slot appears twice, every entry has a token, every token is in the
    /// vocabulary and every slot's context holds its tokens.
    pub fn check_batch(&self, seqs: &[SeqTokens<'_>]) -> Result<(), ModelError> {
        check_entries(seqs, self.n_slots(), self.n_ctx, |slot| self.n_past[slot])?;
        seqs.iter().try_for_each(|seq| self.check_vocab(seq.tokens))
    }

    /// Evaluates every entry of `seqs` after its slot's cached positions, all entries in
    /// one batch (several when they hold more than `n_batch` tokens, cut by
    /// [`plan_batches`]), and returns the logits of each entry's last token, entry after
    /// entry. `run` runs the layers over each batch once it is embedded (all of them on
    /// one device; the windows, streamed or round the ring, elsewhere).
    ///
    /// Each row is computed exactly as the same token evaluated alone: the products and
    /// norms are row by row (the kernels are batch-size invariant), RoPE and attention
    /// per slot.
    pub fn eval_batch_with<E: From<ModelError>>(
        &mut self,
        seqs: &[SeqTokens<'_>],
        run: impl FnMut(&mut Session<'m>) -> Result<(), E>,
    ) -> Result<&[f32], E> {
        self.check_batch(seqs)?;
        self.start_entries(seqs.len());
        self.run_entries(seqs, run)
    }

    /// [`Session::eval_batch_with`] returning the logits of the last `rows[i]` tokens of
    /// entry `i`, entry after entry (what `crate::batch::BatchRowLogits` returns).
    pub fn eval_batch_rows_with<E: From<ModelError>>(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
        run: impl FnMut(&mut Session<'m>) -> Result<(), E>,
    ) -> Result<&[f32], E> {
        self.check_batch(seqs)?;
        self.start_entry_rows(seqs, rows)?;
        self.run_entries(seqs, run)
    }

    /// The batches of `seqs`, each embedded, run by `run` and its logits taken as the
    /// last `start_*` asked.
    fn run_entries<E: From<ModelError>>(
        &mut self,
        seqs: &[SeqTokens<'_>],
        mut run: impl FnMut(&mut Session<'m>) -> Result<(), E>,
    ) -> Result<&[f32], E> {
        let batches = plan_batches(seqs, |slot| self.n_past[slot], self.n_batch);
        let mut spans = Vec::with_capacity(seqs.len());
        for pieces in &batches {
            spans.clear();
            spans.extend(pieces.iter().map(|p| p.span));
            self.begin_spans(&spans)?;
            self.batch_tokens.clear();
            for p in pieces {
                self.batch_tokens
                    .extend_from_slice(&seqs[p.entry].tokens[p.tokens.clone()]);
            }
            let tokens = std::mem::take(&mut self.batch_tokens);
            let embedded = self.embed(&tokens);
            self.batch_tokens = tokens;
            embedded?;
            run(self)?;
            self.finish_batch();
            self.entries_logits(pieces, seqs)?;
        }
        Ok(&self.entry_logits)
    }

    /// Makes room for the logits of `n_entries` entries, which
    /// [`Session::entries_logits`] fills: for a caller that drives the batches of
    /// [`Session::eval_batch_with`] itself (a ring head with several micro-batches in
    /// flight).
    pub fn start_entries(&mut self, n_entries: usize) {
        let n_vocab = self.model.hparams().n_vocab;
        self.entry_rows.clear();
        self.entry_logits.resize(n_entries * n_vocab, 0.0);
    }

    /// [`Session::start_entries`] for the logits of the last `rows[i]` tokens of each
    /// entry `seqs[i]` (checked: 1 to its tokens), entry after entry.
    pub fn start_entry_rows(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
    ) -> Result<(), ModelError> {
        check_rows(seqs, rows)?;
        let n_vocab = self.model.hparams().n_vocab;
        self.entry_rows.clear();
        let mut first = 0;
        for &n in rows {
            self.entry_rows.push((first, n));
            first += n;
        }
        self.entry_logits.resize(first * n_vocab, 0.0);
        Ok(())
    }

    /// The logits of the entries of [`Session::start_entries`], entry after entry.
    pub fn entry_logits(&self) -> &[f32] {
        &self.entry_logits
    }

    /// The logits of the entries that end in the last batch (`pieces`), into their
    /// places in `entry_logits`: their last rows gathered, one output-head product.
    pub fn entries_logits(
        &mut self,
        pieces: &[Piece],
        seqs: &[SeqTokens<'_>],
    ) -> Result<(), ModelError> {
        let Some(first) = self.fill_entry_rows(pieces, seqs) else {
            return Ok(());
        };
        let n = self.host.out_rows.len();
        let n_vocab = self.model.hparams().n_vocab;
        let logits = self.output_rows()?;
        let out = &mut self.entry_logits[first * n_vocab..(first + n) * n_vocab];
        download(self.backend, logits, out)
    }

    /// Which rows of the last batch (`pieces`) [`Session::entries_logits`] takes logits
    /// of, and the place of the first in `entry_logits` (`None`: no row): what a ring
    /// head asks of the device that runs the output layer.
    pub fn entry_rows_wanted(
        &mut self,
        pieces: &[Piece],
        seqs: &[SeqTokens<'_>],
    ) -> Option<(usize, Vec<u32>)> {
        let first = self.fill_entry_rows(pieces, seqs)?;
        Some((first, self.host.out_rows.clone()))
    }

    /// Logits computed elsewhere (by the device that ran the output layer) for the rows
    /// of [`Session::entry_rows_wanted`], into their places in `entry_logits`.
    pub fn put_entry_logits(&mut self, first: usize, logits: &[f32]) -> Result<(), ModelError> {
        let n_vocab = self.model.hparams().n_vocab;
        let end = first * n_vocab + logits.len();
        let Some(place) = self.entry_logits.get_mut(first * n_vocab..end) else {
            return Err(ModelError::OutputSize {
                len: logits.len(),
                needed: self.entry_logits.len().saturating_sub(first * n_vocab),
            });
        };
        place.copy_from_slice(logits);
        Ok(())
    }

    /// Logits of the rows `rows` of the batch in flight (any order), one row of `n_vocab`
    /// after another into `out`, computed as [`Session::entries_logits`] computes them (so
    /// a device that runs the output layer for a ring head gives the bits one device
    /// would).
    pub fn logits_of(&mut self, rows: &[u32], out: &mut Vec<f32>) -> Result<(), ModelError> {
        let n_vocab = self.model.hparams().n_vocab;
        let last_len = self.batch_len;
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= last_len) {
            return Err(ModelError::RowsOutOfBatch {
                rows: bad.to_string(),
                batch: last_len,
                n_batch: self.n_batch,
            });
        }
        out.resize(rows.len() * n_vocab, 0.0);
        if rows.is_empty() {
            return Ok(());
        }
        self.host.out_rows.clear();
        self.host.out_rows.extend_from_slice(rows);
        let logits = self.output_rows()?;
        download(self.backend, logits, out)
    }

    /// Logits of one row computed elsewhere (the last row of a batch, by the device that
    /// ran the output layer), where [`Session::logits`] leaves them.
    pub fn put_logits(&mut self, logits: &[f32]) -> &[f32] {
        self.host.logits.clear();
        self.host.logits.extend_from_slice(logits);
        &self.host.logits
    }

    /// The output rows of the entries that end in `pieces` into `host.out_rows`, and the
    /// place of the first in `entry_logits`.
    fn fill_entry_rows(&mut self, pieces: &[Piece], seqs: &[SeqTokens<'_>]) -> Option<usize> {
        self.host.out_rows.clear();
        let (mut first, mut n) = (None, 0);
        let mut row = 0;
        for p in pieces {
            // The entry's rows with logits: its last `wanted` tokens, from output row `at`.
            let (at, wanted) = self
                .entry_rows
                .get(p.entry)
                .copied()
                .unwrap_or((p.entry, 1));
            let tokens = seqs[p.entry].tokens.len();
            let from = p.tokens.start.max(tokens - wanted);
            if from < p.tokens.end {
                // The rows asked for are entries' tails, so in one batch they are
                // consecutive output rows.
                let out = at + from - (tokens - wanted);
                debug_assert_eq!(out, first.unwrap_or(out) + n);
                first.get_or_insert(out);
                let x = row + from - p.tokens.start;
                let end = row + p.span.len;
                n += end - x;
                self.host.out_rows.extend((x..end).map(|r| r as u32));
            }
            row += p.span.len;
        }
        first
    }

    /// Final norm and output head for the rows `host.out_rows` of the residual stream,
    /// in one product; the logits stay on the backend.
    fn output_rows(&mut self) -> Result<Buf, ModelError> {
        let hp = self.model.hparams();
        let (d, n_vocab, n) = (hp.n_embd, hp.n_vocab, self.host.out_rows.len());
        let x = self.x_on(Side::Main)?;
        let (model, be) = (self.model, self.backend);
        // The norm is row by row, so each run of consecutive rows is normed straight into
        // its place: no gather, which a GPU backend may only have through the host.
        let h = self.bufs.h.head(n * d);
        let norm = model.view(&model.output_norm);
        let rows = &self.host.out_rows;
        let mut i = 0;
        while i < rows.len() {
            let mut end = i + 1;
            while end < rows.len() && rows[end] == rows[end - 1] + 1 {
                end += 1;
            }
            let run = end - i;
            op(
                be.rms_norm(
                    x.slice(rows[i] as usize * d, run * d),
                    norm,
                    hp.rms_eps,
                    h.slice(i * d, run * d),
                ),
                "rms_norm",
            )?;
            i = end;
        }
        let logits = self.out.logits_for(be, n, n_vocab)?;
        op(
            be.matmul(model.view(&model.output), h, n as u32, logits),
            "matmul output",
        )?;
        Ok(logits)
    }

    /// Starts a batch of `n` tokens of slot 0 at position `start`. Cached positions from
    /// `start` on are forgotten first (a new request that shares only a prefix with the
    /// old one).
    pub fn begin_batch(&mut self, start: usize, n: usize) -> Result<(), ModelError> {
        self.begin_spans(&[SeqSpan {
            slot: 0,
            start,
            len: n,
        }])
    }

    /// Starts a batch of `spans`, their rows one after another. Each slot's cached
    /// positions from its span's start on are forgotten first. A span of no rows (only
    /// a whole batch of one may be empty), a slot twice, a gap after a slot's cached
    /// positions or a batch over `n_batch` rows is an error, before anything changes.
    pub fn begin_spans(&mut self, spans: &[SeqSpan]) -> Result<(), ModelError> {
        let n: usize = spans.iter().map(|s| s.len).sum();
        if n > self.n_batch {
            return Err(ModelError::BatchTooLarge {
                n,
                n_batch: self.n_batch,
            });
        }
        for (i, s) in spans.iter().enumerate() {
            let n_past = self.known_slot(s.slot)?;
            if spans[..i].iter().any(|o| o.slot == s.slot) {
                return Err(ModelError::SlotTwice { slot: s.slot });
            }
            if s.len == 0 && spans.len() > 1 {
                return Err(ModelError::EmptyEntry { slot: s.slot });
            }
            if s.start > n_past {
                return Err(ModelError::PositionGap {
                    start: s.start,
                    n_past,
                });
            }
            if s.start + s.len > self.n_ctx {
                return Err(ModelError::ContextFull {
                    needed: s.start + s.len,
                    n_ctx: self.n_ctx,
                });
            }
        }
        let mut row = 0;
        for s in spans {
            if s.start < self.n_past[s.slot] {
                self.truncate_slot(s.slot, s.start)?;
            }
            for (i, p) in self.host.positions[row..row + s.len].iter_mut().enumerate() {
                *p = (s.start + i) as u32;
            }
            row += s.len;
        }
        self.batch.clear();
        self.batch.extend_from_slice(spans);
        self.batch_len = n;
        Ok(())
    }

    /// The spans of the batch in flight, in row order.
    pub fn batch_spans(&self) -> &[SeqSpan] {
        &self.batch
    }

    /// The residual stream of the batch in flight, `n × n_embd`, brought to the host (one
    /// download, unless it is there already): what a ring device sends on.
    pub fn hidden(&mut self) -> Result<&[f32], ModelError> {
        let len = self.residual_rows * self.model.hparams().n_embd;
        if let Residual::Device(side) = self.residual {
            let (be, bufs) = self.side(side);
            download(be, bufs.x, &mut self.host.x[..len])?;
            self.residual = Residual::Host;
        }
        Ok(&self.host.x[..len])
    }

    /// The batch's spans and its residual stream ([`Session::hidden`]): what a ring device
    /// sends on.
    pub fn outgoing(&mut self) -> Result<(&[SeqSpan], &[f32]), ModelError> {
        self.hidden()?;
        let len = self.residual_rows * self.model.hparams().n_embd;
        Ok((&self.batch, &self.host.x[..len]))
    }

    /// The residual stream to fill with activations received from the previous device; it
    /// goes to the backend (one upload) when the next layer runs.
    pub fn hidden_mut(&mut self) -> &mut [f32] {
        let len = self.batch_len * self.model.hparams().n_embd;
        self.residual = Residual::Host;
        self.residual_rows = self.batch_len;
        &mut self.host.x[..len]
    }

    /// The backend of `side` and its buffers.
    fn side(&self, side: Side) -> (&'m BackendBox, &DeviceScratch) {
        match (side, self.gpu, &self.gpu_bufs) {
            (Side::Gpu, Some(gpu), Some(bufs)) => (gpu, bufs),
            _ => (self.backend, &self.bufs),
        }
    }

    /// The residual stream's buffer on `side`, moved there first if it is elsewhere: from
    /// the host, one upload; from the other side, a download and an upload.
    fn x_on(&mut self, side: Side) -> Result<Buf, ModelError> {
        let len = self.residual_rows * self.model.hparams().n_embd;
        let (be, bufs) = self.side(side);
        let x = bufs.x;
        if self.residual != Residual::Device(side) {
            if let Residual::Device(_) = self.residual {
                self.hidden()?;
            }
            upload(be, x, &self.host.x[..len])?;
            self.residual = Residual::Device(side);
        }
        Ok(x)
    }

    /// The host↔device traffic of the session's backends so far (both, with a GPU beside
    /// the CPU): read before and after a window to see what crossed.
    pub fn transfers(&self) -> TransferCounts {
        let own = self.backend.transfers();
        match self.gpu {
            Some(gpu) if self.gpu_bufs.is_some() => own.plus(gpu.transfers()),
            _ => own,
        }
    }

    /// Tells the backend that no operation follows soon, so it frees the cores (a ring
    /// device between its window and the next round).
    pub fn idle(&self) {
        self.backend.idle();
        if let Some(gpu) = self.gpu {
            gpu.idle();
        }
    }

    /// Runs the layers `layers` over the batch in flight (all must be held).
    pub fn run_layers(&mut self, layers: std::ops::Range<usize>) -> Result<(), ModelError> {
        for il in layers {
            let Some((side, index)) = self.kv_layers.get(il).copied().flatten() else {
                return Err(ModelError::LayerNotHeld {
                    layer: il,
                    held: self.held_layers(),
                });
            };
            self.x_on(side)?;
            self.layer(il, side, index)?;
        }
        Ok(())
    }

    /// Marks the batch in flight as cached.
    pub fn finish_batch(&mut self) {
        for s in &self.batch {
            self.n_past[s.slot] = s.start + s.len;
        }
        std::mem::swap(&mut self.last, &mut self.batch);
        self.batch.clear();
        self.batch_len = 0;
    }

    fn held_layers(&self) -> String {
        let held: Vec<String> = (0..self.kv_layers.len())
            .filter(|&l| self.kv_layers[l].is_some())
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
        Ok(&self.host.logits)
    }

    /// Rows of the last batch still cached: up to the first span whose slot has since
    /// been cut before the span's end.
    fn last_rows(&self) -> usize {
        let mut rows = 0;
        for s in &self.last {
            let kept = self.n_past[s.slot].saturating_sub(s.start).min(s.len);
            rows += kept;
            if kept < s.len {
                break;
            }
        }
        rows
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
        let last_len = self.last_rows();
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
        let x = self.x_on(Side::Main)?;
        let (model, be) = (self.model, self.backend);
        let (x, h) = (x.slice(rows.start * d, n * d), self.bufs.h.head(n * d));
        op(
            be.rms_norm(x, model.view(&model.output_norm), hp.rms_eps, h),
            "rms_norm",
        )?;
        let logits = self.out.logits_for(be, n, hp.n_vocab)?;
        op(
            be.matmul(model.view(&model.output), h, n as u32, logits),
            "matmul output",
        )?;
        download(be, logits, out)
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
        let x = self.bufs.x.head(n * d);
        op(
            self.backend.get_rows(table, RSlice::from_slice(tokens), x),
            "get_rows",
        )?;
        self.residual = Residual::Device(Side::Main);
        self.residual_rows = n;
        if self.model.hparams().arch.spec().scale_embeddings {
            op(self.backend.scale(x, (d as f32).sqrt()), "scale embeddings")?;
        }
        Ok(())
    }

    /// RoPE of layer `il`. Local (sliding-window) layers use their own base, and no
    /// position scaling unless the architecture scales them as global ones
    /// (llama.cpp's `rope_freq_*_train_swa`).
    fn rope_params(&self, il: usize) -> RopeParams<'m> {
        let hp = self.model.hparams();
        let local = hp.is_local(il);
        let scaling = if local && !hp.rope_scaling_local {
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
        let attn_factor = yarn_attn_factor(freq_scale, ext_factor) * hp.rope_attn_factor;
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
            attn_factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig,
        }
    }

    /// One decoder layer over the batch in the residual stream, on the backend of `side`;
    /// its keys and values go to layer `index` of that side's KV cache of each span's slot.
    fn layer(&mut self, il: usize, side: Side, index: u32) -> Result<(), ModelError> {
        let model = self.model;
        let hp = model.hparams();
        let w = &model.layers[il];
        let (be, b) = match (side, self.gpu, &self.gpu_bufs) {
            (Side::Gpu, Some(gpu), Some(bufs)) => (gpu, bufs),
            _ => (self.backend, &self.bufs),
        };
        let kvs = match side {
            Side::Main => &self.kv,
            Side::Gpu => &self.kv_gpu,
        };
        let n = self.batch_len;
        let spec = hp.arch.spec();
        let rope = self.rope_params(il);
        let (d, qd, kd, vd) = (hp.n_embd, hp.q_dim(), hp.k_dim(), hp.v_dim());
        let attn_dim = hp.n_head * hp.head_dim_v;
        let nt = n as u32;

        // Attention block.
        let (x, h) = (b.x.head(n * d), b.h.head(n * d));
        op(
            be.rms_norm(x, model.view(&w.attn_norm), hp.rms_eps, h),
            "rms_norm",
        )?;
        let (q, k, v) = (b.q.head(n * qd), b.k.head(n * kd), b.v.head(n * vd));
        op(be.matmul(model.view(&w.wq), h, nt, q), "matmul attn_q")?;
        op(be.matmul(model.view(&w.wk), h, nt, k), "matmul attn_k")?;
        op(be.matmul(model.view(&w.wv), h, nt, v), "matmul attn_v")?;
        for (bias, out) in [(&w.bq, q), (&w.bk, k), (&w.bv, v)] {
            if let Some(bias) = bias {
                op(be.add_bias(out, model.view(bias)), "add_bias")?;
            }
        }
        // Per-head Q/K norm: the norm weight is one head long, so each head is a row.
        let (q, k) = match (&w.attn_q_norm, &w.attn_k_norm) {
            (Some(qn), Some(kn)) => {
                let (q_out, k_out) = (b.q_normed.head(n * qd), b.k_normed.head(n * kd));
                op(
                    be.rms_norm(q, model.view(qn), hp.rms_eps, q_out),
                    "rms_norm attn_q_norm",
                )?;
                op(
                    be.rms_norm(k, model.view(kn), hp.rms_eps, k_out),
                    "rms_norm attn_k_norm",
                )?;
                (q_out, k_out)
            }
            _ => (q, k),
        };
        let pos = RSlice::from_slice(&self.host.positions[..n]);
        let hd = hp.head_dim_k as u32;
        op(be.rope(q, hp.n_head as u32, hd, pos, rope), "rope q")?;
        op(be.rope(k, hp.n_head_kv as u32, hd, pos, rope), "rope k")?;
        let scale = match spec.attention_scale {
            AttentionScale::InvSqrtHeadDim => hp.attention_scale,
            AttentionScale::Gemma3QueryPreAttn => {
                op(be.scale(q, hp.attention_scale), "scale q")?;
                1.0
            }
        };
        let params = AttentionParams {
            layer: index,
            n_tokens: 0,
            start_pos: 0,
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
        // Every span's rows in one call, each against its slot's cache and positions.
        let spans = &mut self.attn_spans;
        spans.clear();
        spans.extend(self.batch.iter().map(|s| AttentionSpan {
            // A layer is only run when it is held, so every slot has its cache.
            kv: kvs.get(s.slot).copied().unwrap_or_default(),
            n_tokens: s.len as u32,
            start_pos: s.start as u32,
        }));
        let attn = b.attn.head(n * attn_dim);
        let spans = RSlice::from_slice(spans);
        match &w.attn_sinks {
            None => op(
                be.attention_spans(spans, q, k, v, params, attn),
                "attention",
            )?,
            Some(sinks) => op(
                be.attention_spans_sinks(
                    spans,
                    q,
                    k,
                    v,
                    RSlice::from_slice(&sinks.values),
                    params,
                    attn,
                ),
                "attention",
            )?,
        }
        op(
            be.matmul(model.view(&w.wo), attn, nt, h),
            "matmul attn_output",
        )?;
        if let Some(bo) = &w.bo {
            op(be.add_bias(h, model.view(bo)), "add_bias attn_output")?;
        }
        add_residual(be, model, &w.attn_post_norm, hp.rms_eps, x, h, b.post)?;

        // Feed-forward block: dense or experts, each kind its own code.
        op(
            be.rms_norm(x, model.view(&w.ffn_norm), hp.rms_eps, h),
            "rms_norm",
        )?;
        let cx = FfnContext {
            be,
            model,
            act: spec.ffn,
            layer: il,
            experts: self.experts.as_deref(),
        };
        w.ffn.forward(cx, h, n, &b.ffn, &mut self.host.ffn)?;
        add_residual(be, model, &w.ffn_post_norm, hp.rms_eps, x, h, b.post)
    }

    /// Final norm and output head for row `row` of the residual stream, its logits brought
    /// to the host.
    fn output(&mut self, row: usize) -> Result<(), ModelError> {
        let model = self.model;
        let hp = model.hparams();
        let d = hp.n_embd;
        let x = self.x_on(Side::Main)?;
        let be = self.backend;
        let (x, h) = (x.slice(row * d, d), self.bufs.h.head(d));
        op(
            be.rms_norm(x, model.view(&model.output_norm), hp.rms_eps, h),
            "rms_norm",
        )?;
        let logits = self.out.logits.head(hp.n_vocab);
        op(
            be.matmul(model.view(&model.output), h, 1, logits),
            "matmul output",
        )?;
        download(be, logits, &mut self.host.logits)
    }
}

/// The attention factor llama.cpp gives RoPE under YaRN (`llama_context`'s
/// `yarn_attn_factor`): `mscale(s) / (1 + 0.1 ln s)` for the scale `s = 1 / freq_scale`,
/// with `mscale(s) = 1 + 0.1 ln s` above 1 — about 1, since the rotation multiplies by
/// `1 + 0.1 ln s` again ([`RopeParams::fill_cos_sin`]); computed in f32 as there, so the
/// rotated values round alike. 1 without YaRN.
fn yarn_attn_factor(freq_scale: f32, ext_factor: f32) -> f32 {
    if ext_factor == 0.0 {
        return 1.0;
    }
    let factor = 1.0 / freq_scale;
    let mscale = if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    };
    mscale * (1.0 / (1.0 + 0.1 * factor.ln()))
}

/// Fails with the first weight of layer `il` whose type `backend` cannot compute.
fn check_layer_types(model: &Model, backend: &BackendBox, il: usize) -> Result<(), ModelError> {
    match model
        .layer_tensors(il)
        .find(|t| !backend.supports(t.ggml_type.id()))
    {
        Some(t) => Err(ModelError::UnsupportedTensorType {
            path: model.gguf().path().to_path_buf(),
            tensor: t.name.clone(),
            ty: t.ggml_type.name().to_string(),
            backend: backend.name().into_string(),
        }),
        None => Ok(()),
    }
}

/// `x += post_norm(h)`, or `x += h` without a post-norm.
fn add_residual(
    be: &BackendBox,
    model: &Model,
    post_norm: &Option<crate::gguf::TensorInfo>,
    eps: f32,
    x: Buf,
    h: Buf,
    post: Buf,
) -> Result<(), ModelError> {
    match post_norm {
        Some(norm) => {
            let post = post.head(h.len());
            op(
                be.rms_norm(h, model.view(norm), eps, post),
                "rms_norm post-norm",
            )?;
            op(be.add(x, post), "add")
        }
        None => op(be.add(x, h), "add"),
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        for &kv in &self.kv {
            self.backend.kv_drop(kv);
        }
        self.bufs.free(self.backend);
        self.out.free(self.backend);
        if let Some(gpu) = self.gpu {
            for &kv in &self.kv_gpu {
                gpu.kv_drop(kv);
            }
            if let Some(bufs) = &mut self.gpu_bufs {
                bufs.free(gpu);
            }
        }
    }
}
