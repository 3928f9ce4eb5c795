//! A device running the whole model alone — a ring of one. When its weights do not fit its
//! memory it gets a ring device's treatment ([`Residency`]): the first layers stay
//! resident, the others are streamed in chunks, each read two chunks ahead of its use and
//! released right after it (MRU), instead of leaving the kernel's LRU to evict under a
//! cyclic access pattern, its worst case.
//!
//! A mixture-of-experts model is planned by expert instead when its layers' shared parts
//! fit ([`ExpertCache::plan_alone`]): every layer's attention, norms and router stay
//! resident, with the most used experts; the others are streamed per use.
//!
//! When everything fits, [`LocalSession`] is a plain [`Session`]: no hint, no extra work.

use std::sync::Arc;

use prima_core::batch::{BatchForward, BatchRowLogits, SeqTokens};
use prima_core::generate::{Forward, RowLogits};
use prima_core::model::{Model, ModelError, Session};

use super::budget::mib;
use super::expert_cache::{ExpertCache, ExpertCacheStats};
use super::residency::Residency;

/// One line on what a plan keeps resident and what it streams.
pub fn describe_plan(model: &Model, residency: &Residency) -> String {
    let windows = residency.windows();
    let resident: Vec<_> = windows.iter().filter(|w| w.fully_resident()).collect();
    let streamed: Vec<_> = windows.iter().filter(|w| !w.fully_resident()).collect();
    let span = |ws: &[&super::residency::WindowPages]| match (ws.first(), ws.last()) {
        (Some(a), Some(b)) => format!("layers {}–{}", a.layers.start, b.layers.end - 1),
        _ => "no layer".to_string(),
    };
    let resident_bytes: u64 = resident.iter().map(|w| w.bytes).sum();
    format!(
        "{} resident ({}) + output head {}; {} streamed in {} chunks ({} read per token)",
        span(&resident),
        mib(resident_bytes),
        mib(model.read_whole_bytes()),
        span(&streamed),
        streamed.len(),
        mib(residency.streamed_bytes()),
    )
}

/// A [`Session`] on one device, streaming what does not fit its memory budget.
pub struct LocalSession<'m> {
    session: Session<'m>,
    /// Present only when some layer is streamed.
    residency: Option<Residency>,
    /// Present when experts are streamed (the session's expert policy).
    experts: Option<Arc<ExpertCache<'m>>>,
}

impl<'m> LocalSession<'m> {
    /// Runs `session` under `residency`, which is dropped when it streams nothing.
    pub fn new(session: Session<'m>, residency: Option<Residency>) -> LocalSession<'m> {
        LocalSession {
            session,
            residency: residency.filter(Residency::streams),
            experts: None,
        }
    }

    /// Runs `session` with every layer resident but experts streamed by `cache`, which
    /// becomes the session's expert policy.
    pub fn with_experts(mut session: Session<'m>, cache: ExpertCache<'m>) -> LocalSession<'m> {
        let cache = Arc::new(cache);
        session.set_expert_policy(Some(cache.clone()));
        LocalSession {
            session,
            residency: None,
            experts: Some(cache),
        }
    }

    /// What the resident-expert cache served (`None` when experts are not streamed).
    pub fn expert_stats(&self) -> Option<ExpertCacheStats> {
        self.experts.as_ref().map(|c| c.stats())
    }

    pub fn expert_cache(&self) -> Option<&ExpertCache<'m>> {
        self.experts.as_deref()
    }

    pub fn residency(&self) -> Option<&Residency> {
        self.residency.as_ref()
    }

    pub fn session(&self) -> &Session<'m> {
        &self.session
    }
}

impl Forward for LocalSession<'_> {
    type Error = ModelError;

    fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        let Some(residency) = &self.residency else {
            return self.session.eval(tokens);
        };
        let session = &mut self.session;
        session.check_fits(tokens)?;
        let Some(last_len) = tokens.chunks(session.n_batch()).last().map(<[u32]>::len) else {
            // Nothing to evaluate: the session answers with the logits it has.
            return session.eval(tokens);
        };
        let model = session.model();
        for chunk in tokens.chunks(session.n_batch()) {
            session.begin_batch(session.n_past(), chunk.len())?;
            session.embed(chunk)?;
            for (i, w) in residency.windows().iter().enumerate() {
                session.run_layers(w.layers.clone())?;
                residency.after_window(model, i);
            }
            session.finish_batch();
        }
        session.logits(last_len - 1)
    }

    fn n_past(&self) -> usize {
        self.session.n_past()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        self.session.truncate(n)
    }
}

/// Every slot's rows of a batch go through each streamed chunk together: a chunk is read
/// once per batch, whatever the number of sequences in it.
impl BatchForward for LocalSession<'_> {
    type Error = ModelError;

    fn n_slots(&self) -> usize {
        self.session.n_slots()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn n_batch(&self) -> usize {
        self.session.n_batch()
    }

    fn n_vocab(&self) -> usize {
        self.session.model().hparams().n_vocab
    }

    fn n_past(&self, slot: usize) -> usize {
        self.session.slot_n_past(slot)
    }

    fn truncate(&mut self, slot: usize, n: usize) -> Result<(), ModelError> {
        self.session.truncate_slot(slot, n)
    }

    fn eval_batch(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], ModelError> {
        let LocalSession {
            session, residency, ..
        } = self;
        let Some(residency) = residency else {
            return session.eval_batch(seqs);
        };
        let model = session.model();
        session.eval_batch_with(seqs, |s| {
            for (i, w) in residency.windows().iter().enumerate() {
                s.run_layers(w.layers.clone())?;
                residency.after_window(model, i);
            }
            Ok::<(), ModelError>(())
        })
    }
}

impl BatchRowLogits for LocalSession<'_> {
    fn eval_batch_rows(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
    ) -> Result<&[f32], ModelError> {
        let LocalSession {
            session, residency, ..
        } = self;
        let Some(residency) = residency else {
            return session.eval_batch_rows(seqs, rows);
        };
        let model = session.model();
        session.eval_batch_rows_with(seqs, rows, |s| {
            for (i, w) in residency.windows().iter().enumerate() {
                s.run_layers(w.layers.clone())?;
                residency.after_window(model, i);
            }
            Ok::<(), ModelError>(())
        })
    }
}

impl RowLogits for LocalSession<'_> {
    fn n_batch(&self) -> usize {
        self.session.n_batch()
    }

    fn row_logits(
        &mut self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.session.logits_rows(rows, out)
    }
}
