//! Experts as the unit of residency: which experts of a device's MoE layers stay in
//! memory, and the page hints that stream the others.
//!
//! A MoE layer's weights are mostly experts, and a token reads only the k its router
//! picks, so a device whose layers do not fit keeps each layer's *shared part*
//! (attention, norms, router: read by every token) resident and, of the experts, the most
//! used ones its budget holds; the others are *streamed*: read from the mapping when the
//! router picks them (queued on the read-ahead thread the moment the layer's routing is
//! known, so the reads of a layer's later experts overlap the products of its first) and
//! released right after their down-projection (MRU, as streamed layers are). Use is
//! counted as requests run ([`ExpertUse`]); the hot set starts uniform (every layer keeps
//! as many experts) and is re-planned from the counts after [`FIRST_REPLAN_ROWS`] routed
//! rows, then at doubling intervals up to every [`REPLAN_ROWS`], with hysteresis: an expert replaces a resident one only when it was used
//! [`SWAP_MARGIN`] times as much, so a set that is about right stays put.
//!
//! **Page sharing.** An expert's slab in each of `ffn_{gate,up,down}_exps` is rarely page
//! aligned, so its first and last pages may hold a neighbour's bytes. Releases narrow each
//! range inward to the pages it covers whole (`GgufFile::advise_pages`), so a page a
//! resident neighbour shares is never released; reads widen outward, which only reads a
//! neighbour's bytes early. The cost: at most two pages per slab of a streamed expert stay
//! cached, six per expert, counted in the read-ahead room.
//!
//! [`hot_set`] and [`expected_hit_rate`] are pure: Halda's latency model asks the second
//! what a budget of B bytes for a range of layers' experts hits.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prima_core::gguf::{PageHint, ReadAhead};
use prima_core::model::{ExpertPolicy, ExpertUse, Model, Routing};

use super::expert_use;
use super::protocol::{ReleaseMethod, ReleasePolicy};

/// Rows routed (summed over the device's MoE layers) before the first re-plan of the hot
/// set; the interval then doubles up to [`REPLAN_ROWS`], so the set leaves the uniform
/// guess soon and then changes seldom.
pub const FIRST_REPLAN_ROWS: u64 = 256;

/// Rows routed between two re-plans once the counts have settled.
pub const REPLAN_ROWS: u64 = 4096;

/// How much more an expert must have been used than the resident one it replaces.
pub const SWAP_MARGIN: f64 = 1.25;

/// One expert's estimated share of its layer's choices: its count plus one (so that
/// before any count every expert is equally likely), over the layer's total.
fn shares(counts: Option<&[u64]>, n_expert: usize) -> Vec<f64> {
    let counts: Vec<f64> = (0..n_expert)
        .map(|e| counts.and_then(|c| c.get(e)).copied().unwrap_or(0) as f64 + 1.0)
        .collect();
    let total: f64 = counts.iter().sum();
    counts.iter().map(|c| c / total).collect()
}

/// The experts to keep resident among `n_expert` experts in each of `layers.len()` layers
/// (`expert_bytes[i]` bytes each in layer `i`, use counts `counts[i]`, or uniform when
/// `None`) under `budget` bytes: the largest shares first (a share is an expert's part of
/// its layer's choices, so this maximises the expected hits per byte when experts are
/// the same size), ties going to the lower expert index and then to the earlier layer, so
/// a uniform set spreads evenly over the layers. `out[i][e]`: expert `e` of layer `i`.
pub fn hot_set(
    expert_bytes: &[u64],
    n_expert: usize,
    counts: Option<&[Vec<u64>]>,
    budget: u64,
) -> Vec<Vec<bool>> {
    let n_layers = expert_bytes.len();
    let mut candidates: Vec<(f64, usize, usize)> = Vec::with_capacity(n_layers * n_expert);
    for (i, _) in expert_bytes.iter().enumerate() {
        let layer_counts = counts.and_then(|c| c.get(i)).map(Vec::as_slice);
        for (e, s) in shares(layer_counts, n_expert).into_iter().enumerate() {
            candidates.push((s, e, i));
        }
    }
    // Share per byte, largest first; then expert index, then layer.
    candidates.sort_by(|a, b| {
        let (pa, pb) = (
            a.0 / expert_bytes[a.2].max(1) as f64,
            b.0 / expert_bytes[b.2].max(1) as f64,
        );
        pb.total_cmp(&pa).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
    });
    let mut out = vec![vec![false; n_expert]; n_layers];
    let mut left = budget;
    for (_, e, i) in candidates {
        if expert_bytes[i] <= left {
            left -= expert_bytes[i];
            out[i][e] = true;
        }
    }
    out
}

/// The fraction of expert reads a resident set of `budget` bytes serves from memory, for
/// `n_layers` layers of `n_expert` experts of `expert_bytes` bytes each, with use counts
/// `counts[i][e]` for layer `i` of the range (or uniform use when `None`): the hot set
/// [`hot_set`] keeps, weighted by each expert's share of its layer's choices. Uniform use
/// gives the fraction of experts that fit; skewed use more.
pub fn expected_hit_rate(
    n_layers: usize,
    n_expert: usize,
    expert_bytes: u64,
    counts: Option<&[Vec<u64>]>,
    budget: u64,
) -> f64 {
    if n_layers == 0 || n_expert == 0 {
        return 1.0;
    }
    let bytes = vec![expert_bytes; n_layers];
    let set = hot_set(&bytes, n_expert, counts, budget);
    hit_rate_of(&set, n_expert, counts)
}

/// The expected hit rate of the resident set `set` under `counts` (uniform when `None`).
fn hit_rate_of(set: &[Vec<bool>], n_expert: usize, counts: Option<&[Vec<u64>]>) -> f64 {
    if set.is_empty() {
        return 1.0;
    }
    let total: f64 = set
        .iter()
        .enumerate()
        .map(|(i, resident)| {
            let layer_counts = counts.and_then(|c| c.get(i)).map(Vec::as_slice);
            shares(layer_counts, n_expert)
                .iter()
                .zip(resident)
                .filter(|(_, &r)| r)
                .map(|(s, _)| s)
                .sum::<f64>()
        })
        .sum();
    total / set.len() as f64
}

/// What an expert cache has served since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpertCacheStats {
    /// Chosen experts that were resident (one per expert per layer per batch).
    pub hits: u64,
    /// Chosen experts that were streamed.
    pub misses: u64,
    /// Bytes of streamed experts read (by plan: each miss's slabs).
    pub streamed_bytes: u64,
    /// Experts resident now, and their bytes.
    pub resident_experts: u64,
    pub resident_bytes: u64,
    /// Times the hot set changed.
    pub replans: u64,
    /// Next-layer guesses (the next layer's router on this layer's rows): chosen experts
    /// that were guessed, of all chosen experts of guessed layers.
    pub predicted: u64,
    pub predictable: u64,
}

impl ExpertCacheStats {
    pub fn hit_rate(&self) -> f64 {
        let all = self.hits + self.misses;
        if all == 0 {
            0.0
        } else {
            self.hits as f64 / all as f64
        }
    }

    /// The fraction of chosen experts the next-layer guess named (0 without guesses).
    pub fn prediction_rate(&self) -> f64 {
        if self.predictable == 0 {
            0.0
        } else {
            self.predicted as f64 / self.predictable as f64
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        let guess = if self.predictable > 0 {
            format!(
                "; next-layer guess {:.1}% right",
                100.0 * self.prediction_rate()
            )
        } else {
            String::new()
        };
        format!(
            "experts: {} hits, {} misses ({:.1}% hit), {:.1} MiB streamed; {} resident ({:.1} MiB), {} re-plans{guess}",
            self.hits,
            self.misses,
            100.0 * self.hit_rate(),
            self.streamed_bytes as f64 / (1u64 << 20) as f64,
            self.resident_experts,
            self.resident_bytes as f64 / (1u64 << 20) as f64,
            self.replans,
        )
    }
}

/// The hot set as it changes: which experts are resident, by model layer.
struct HotSet {
    /// Rows routed when the set was last planned, and until the next plan.
    planned_at: u64,
    interval: u64,
    /// The budget's bytes in use.
    resident_bytes: u64,
}

/// A device's expert residency: an [`ExpertPolicy`] for its session's MoE layers.
pub struct ExpertCache<'m> {
    /// The MoE layers this device computes, in order.
    layers: Vec<usize>,
    n_expert: usize,
    /// One expert's bytes, by model layer.
    expert_bytes: Vec<u64>,
    /// Each expert's file ranges, `[il * n_expert + e]`.
    ranges: Vec<Vec<Range<u64>>>,
    /// Resident flags, `[il * n_expert + e]` (false for layers not held).
    resident: Vec<AtomicBool>,
    /// Resident experts whose pages were never read in (promoted by a re-plan, or the
    /// first hot set before [`ExpertCache::warm`]): their first use reads them with the
    /// reader's large reads, not a page at a time (they are hinted random).
    unread: Vec<AtomicBool>,
    /// Resident experts being read in that way; their products wait for the read.
    reading: Vec<AtomicBool>,
    /// Bytes of experts the budget holds.
    budget: u64,
    uses: Arc<ExpertUse>,
    routed_rows: AtomicU64,
    /// Whether the batch being computed is read in bulk ([`BULK_ROWS`]): with
    /// [`BulkMode::Wait`] its experts' products wait for their reads.
    bulk: AtomicBool,
    /// How batches of more than [`BULK_ROWS`] rows read (`$PRIMA_EXPERT_BULK`).
    bulk_mode: BulkMode,
    /// A token's streamed expert waits for the reader's large reads before its products
    /// (`$PRIMA_EXPERT_WAIT`, default on; `off`: they fault what is not read yet).
    token_wait: bool,
    hot: Mutex<HotSet>,
    hits: AtomicU64,
    misses: AtomicU64,
    streamed_bytes: AtomicU64,
    replans: AtomicU64,
    release: bool,
    hint: PageHint,
    reader: Option<ReadAhead>,
    /// Next-layer guesses, when asked for.
    guesses: Option<Mutex<Guesses>>,
    prefetch: bool,
    /// Ranges every token reads and this device keeps resident (shared parts, output
    /// head), read by [`ExpertCache::warm`].
    keep: Vec<Range<u64>>,
    /// Where the counts are saved when the cache is dropped, and whether the first plan
    /// came from it.
    use_file: Option<std::path::PathBuf>,
    learned: bool,
    model: &'m Model,
}

impl std::fmt::Debug for ExpertCache<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertCache")
            .field("layers", &self.layers)
            .field("budget", &self.budget)
            .field("stats", &self.stats())
            .finish()
    }
}

/// How an expert cache gives its page hints.
#[derive(Debug, Clone, Copy)]
pub struct ExpertHints {
    pub prefetch: bool,
    pub release: ReleasePolicy,
    pub method: ReleaseMethod,
    /// Guess the next layer's experts (its router applied to this layer's rows, for
    /// batches of up to [`PREDICT_ROWS`] rows), count how often the guess is right, and,
    /// with `prefetch`, read the guessed streamed experts ahead.
    pub predict: bool,
    /// Start from the use counts saved by earlier runs (when the plan is given none) and
    /// save the counts when the cache is dropped ([`super::expert_use`]).
    pub persist: bool,
}

/// Whether devices guess the next layer's experts unless told otherwise: no. Measured on
/// a skewed random-weight model (bench-qwen3moe, 95% hits), the guess named 75% of the
/// chosen experts, but reading the guessed streamed experts ahead cost more disk time on
/// wrong guesses than it hid on right ones (a layer's products are shorter than one
/// expert's read).
pub const PREDICT_DEFAULT: bool = false;

/// Batches larger than this are not guessed: their union of experts is most of a layer.
pub const PREDICT_ROWS: usize = 4;

/// Batches of more rows than this (a prompt) read their streamed experts in bulk: the
/// slabs of neighbouring experts of each tensor merged into one sequential read, queued
/// on the read-ahead thread in groups that fit its room ([`BulkMode`]).
pub const BULK_ROWS: usize = 4;

/// How a batch of more than [`BULK_ROWS`] rows reads its streamed experts
/// (`$PRIMA_EXPERT_BULK`): `off`, one expert after another as for a token; `read`
/// (default), in merged sequential reads; `wait`, and each expert's products wait for its
/// read. Measured on bench-qwen3moe (8-token prompt, 219 MiB cgroup, 5 runs each), the
/// three were within noise of each other, `read` slightly ahead, so it is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BulkMode {
    Off,
    Read,
    Wait,
}

impl BulkMode {
    fn from_env() -> BulkMode {
        match std::env::var("PRIMA_EXPERT_BULK").as_deref() {
            Ok("off") => BulkMode::Off,
            Ok("wait") => BulkMode::Wait,
            _ => BulkMode::Read,
        }
    }
}

/// The next-layer guesses in flight and how they fared.
#[derive(Default)]
struct Guesses {
    /// Per model layer, the experts guessed for its next routing (empty: none).
    next: Vec<Vec<usize>>,
    predicted: u64,
    predictable: u64,
    /// Router logits of one row, reused.
    logits: Vec<f32>,
}

impl<'m> ExpertCache<'m> {
    /// The room kept beside the resident experts for streamed ones in flight: twice a
    /// token's chosen experts of the largest layer (one layer's being computed, the
    /// reader ahead on the rest), and the pages a release leaves at the slabs' edges.
    pub fn room(model: &Model) -> u64 {
        let Some(shape) = model.experts() else {
            return 0;
        };
        let largest = (0..model.hparams().n_layers)
            .map(|il| model.expert_bytes(il))
            .max()
            .unwrap_or(0);
        2 * shape.n_expert_used as u64 * largest + 6 * 4096 * shape.n_expert_used as u64
    }

    /// A device alone under `budget` bytes of weights: every layer's shared part and the
    /// output head resident, and of the experts the hottest that fit in what is left
    /// beside [`ExpertCache::room`]. `None` for a dense model, when everything fits
    /// (nothing to stream), or when the shared parts do not fit (layers must be streamed
    /// whole: [`super::residency::Residency::plan_alone`]).
    pub fn plan_alone(
        model: &'m Model,
        budget: u64,
        counts: Option<&[Vec<u64>]>,
        hints: ExpertHints,
    ) -> Option<ExpertCache<'m>> {
        let n = model.hparams().n_layers;
        let layers: Vec<usize> = (0..n).collect();
        let mut keep: Vec<Range<u64>> = model
            .read_whole_tensors()
            .map(|t| t.offset..t.offset + t.n_bytes)
            .collect();
        keep.extend(shared_ranges(model, &layers));
        let fixed = model.read_whole_bytes();
        ExpertCache::plan(model, layers, budget, fixed, keep, counts, hints)
    }

    /// A ring device computing `layers` (its CPU layers) under `budget` bytes for their
    /// weights: the layers' shared parts resident, and the hottest experts in what is left
    /// beside [`ExpertCache::room`]. `None` as for [`ExpertCache::plan_alone`].
    pub fn plan_layers(
        model: &'m Model,
        layers: &[usize],
        budget: u64,
        counts: Option<&[Vec<u64>]>,
        hints: ExpertHints,
    ) -> Option<ExpertCache<'m>> {
        let keep = shared_ranges(model, layers);
        ExpertCache::plan(model, layers.to_vec(), budget, 0, keep, counts, hints)
    }

    fn plan(
        model: &'m Model,
        layers: Vec<usize>,
        budget: u64,
        fixed: u64,
        keep: Vec<Range<u64>>,
        counts: Option<&[Vec<u64>]>,
        hints: ExpertHints,
    ) -> Option<ExpertCache<'m>> {
        let shape = model.experts()?;
        let n_layers = model.hparams().n_layers;
        let ne = shape.n_expert;
        let shared: u64 = layers.iter().map(|&il| model.layer_shared_bytes(il)).sum();
        let all_experts: u64 = layers
            .iter()
            .map(|&il| ne as u64 * model.expert_bytes(il))
            .sum();
        if fixed + shared + all_experts <= budget {
            return None;
        }
        let room = ExpertCache::room(model);
        let for_experts = budget.checked_sub(fixed + shared + room)?;
        let use_file = hints.persist.then(|| expert_use::use_file(model)).flatten();
        let saved = match (counts, &use_file) {
            (None, Some(path)) => expert_use::load(path, n_layers, ne),
            _ => None,
        };
        let learned = saved.is_some();
        let counts = counts.or(saved.as_deref());
        let expert_bytes: Vec<u64> = (0..n_layers).map(|il| model.expert_bytes(il)).collect();
        let held_bytes: Vec<u64> = layers.iter().map(|&il| expert_bytes[il]).collect();
        let held_counts: Option<Vec<Vec<u64>>> = counts.map(|c| {
            layers
                .iter()
                .map(|&il| c.get(il).cloned().unwrap_or_default())
                .collect()
        });
        let set = hot_set(&held_bytes, ne, held_counts.as_deref(), for_experts);
        let resident: Vec<AtomicBool> =
            (0..n_layers * ne).map(|_| AtomicBool::new(false)).collect();
        let mut resident_bytes = 0;
        for (i, &il) in layers.iter().enumerate() {
            for e in 0..ne {
                if set[i][e] {
                    resident[il * ne + e].store(true, Ordering::Relaxed);
                    resident_bytes += expert_bytes[il];
                }
            }
        }
        let unread: Vec<AtomicBool> = resident
            .iter()
            .map(|r| AtomicBool::new(r.load(Ordering::Relaxed)))
            .collect();
        let reading: Vec<AtomicBool> = (0..n_layers * ne).map(|_| AtomicBool::new(false)).collect();
        let ranges = (0..n_layers)
            .flat_map(|il| (0..ne).map(move |e| (il, e)))
            .map(|(il, e)| model.expert_ranges(il, e))
            .collect();
        let uses = Arc::new(ExpertUse::new(n_layers, ne));
        if let Some(c) = counts {
            uses.merge(c);
        }
        let reader = if hints.prefetch {
            match model.gguf().read_ahead(room) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "could not start the expert read-ahead thread");
                    None
                }
            }
        } else {
            None
        };
        // A streamed expert is read alone: the kernel's read-around (its readahead window,
        // MiBs on some disks) would pull its neighbours in too, evicting resident ones.
        for &il in &layers {
            for t in model.layer_tensors(il).filter(|t| t.dims.len() == 3) {
                let range = t.offset..t.offset + t.n_bytes;
                if let Err(e) = model.gguf().advise_pages(range, PageHint::Random) {
                    tracing::debug!(error = %e, "random-access hint refused");
                }
            }
        }
        let hint = match hints.method {
            ReleaseMethod::Pageout => PageHint::PageOut,
            ReleaseMethod::Cold => PageHint::Cold,
            ReleaseMethod::Dontneed => PageHint::DontNeed,
        };
        Some(ExpertCache {
            layers,
            n_expert: ne,
            expert_bytes,
            ranges,
            resident,
            unread,
            reading,
            budget: for_experts,
            uses,
            routed_rows: AtomicU64::new(0),
            bulk: AtomicBool::new(false),
            bulk_mode: BulkMode::from_env(),
            token_wait: std::env::var("PRIMA_EXPERT_WAIT").as_deref() != Ok("off"),
            hot: Mutex::new(HotSet {
                planned_at: 0,
                interval: FIRST_REPLAN_ROWS,
                resident_bytes,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            streamed_bytes: AtomicU64::new(0),
            replans: AtomicU64::new(0),
            release: hints.release == ReleasePolicy::Mru,
            hint,
            reader,
            guesses: hints.predict.then(|| {
                Mutex::new(Guesses {
                    next: vec![Vec::new(); n_layers],
                    ..Guesses::default()
                })
            }),
            prefetch: hints.prefetch,
            keep,
            use_file,
            learned,
            model,
        })
    }

    /// The use counts gathered so far (and those the plan started from).
    pub fn uses(&self) -> &Arc<ExpertUse> {
        &self.uses
    }

    /// Whether expert `e` of layer `il` is resident now.
    pub fn is_resident(&self, il: usize, e: usize) -> bool {
        self.resident
            .get(il * self.n_expert + e)
            .is_some_and(|r| r.load(Ordering::Relaxed))
    }

    /// Bytes of experts the budget holds.
    pub fn expert_budget(&self) -> u64 {
        self.budget
    }

    pub fn stats(&self) -> ExpertCacheStats {
        let hot = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        ExpertCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            streamed_bytes: self.streamed_bytes.load(Ordering::Relaxed),
            resident_experts: self
                .resident
                .iter()
                .filter(|r| r.load(Ordering::Relaxed))
                .count() as u64,
            resident_bytes: hot.resident_bytes,
            replans: self.replans.load(Ordering::Relaxed),
            ..self.guess_stats()
        }
    }

    fn guess_stats(&self) -> ExpertCacheStats {
        match &self.guesses {
            Some(g) => {
                let g = g.lock().unwrap_or_else(|e| e.into_inner());
                ExpertCacheStats {
                    predicted: g.predicted,
                    predictable: g.predictable,
                    ..ExpertCacheStats::default()
                }
            }
            None => ExpertCacheStats::default(),
        }
    }

    /// Scores the guess for `layer` against `routing`, drops what it read ahead in vain,
    /// and guesses the next held layer's experts from `routing`'s rows.
    fn guess(&self, guesses: &Mutex<Guesses>, layer: usize, routing: Routing<'_>) {
        let mut g = guesses.lock().unwrap_or_else(|e| e.into_inner());
        let g = &mut *g;
        let guessed = std::mem::take(&mut g.next[layer]);
        if !guessed.is_empty() {
            for (e, _) in routing.chosen() {
                g.predictable += 1;
                if guessed.contains(&e) {
                    g.predicted += 1;
                }
            }
            // Read ahead and not chosen: release it as a used streamed expert.
            for &e in &guessed {
                if routing.rows(e) == 0 && !self.is_resident(layer, e) && self.prefetch {
                    self.release_expert(layer, e);
                }
            }
        }
        let next = layer + 1;
        let d = self.model.hparams().n_embd;
        let input = routing.input();
        let n = input.len() / d.max(1);
        if n == 0 || n > PREDICT_ROWS || !self.layers.contains(&next) {
            return;
        }
        let Some(router) = self.model.router(next) else {
            return;
        };
        if router.ggml_type != prima_core::gguf::GgmlType::F32 {
            return;
        }
        let Some(k) = self.model.experts().map(|e| e.n_expert_used) else {
            return;
        };
        let bytes = self.model.gguf().tensor_data(router);
        let ne = self.n_expert;
        if bytes.len() != ne * d * 4 {
            return;
        }
        let mut chosen: Vec<usize> = Vec::with_capacity(n * k);
        for row in input.chunks_exact(d) {
            g.logits.clear();
            for e in 0..ne {
                let w = &bytes[e * d * 4..(e + 1) * d * 4];
                let dot: f32 = w
                    .chunks_exact(4)
                    .zip(row)
                    .map(|(b, &x)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * x)
                    .sum();
                g.logits.push(dot);
            }
            // The softmax keeps the order: the k largest logits are the k chosen.
            let mut order: Vec<usize> = (0..ne).collect();
            order.sort_by(|&a, &b| g.logits[b].total_cmp(&g.logits[a]).then(a.cmp(&b)));
            for &e in order.iter().take(k) {
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
        }
        if self.prefetch {
            if let Some(reader) = &self.reader {
                for &e in chosen.iter().filter(|&&e| !self.is_resident(next, e)) {
                    reader.read(&self.ranges[next * ne + e]);
                }
            }
        }
        g.next[next] = chosen;
    }

    /// One line on what the plan keeps and streams.
    pub fn describe(&self) -> String {
        let model = self.model;
        let s = self.stats();
        let all = self.layers.len() * self.n_expert;
        let shared: u64 = self
            .layers
            .iter()
            .map(|&il| model.layer_shared_bytes(il))
            .sum();
        let start = if self.learned {
            "hottest by earlier runs' counts"
        } else {
            "hottest first"
        };
        format!(
            "layers {}–{}: shared parts resident ({:.1} MiB), {} of {} experts resident ({:.1} MiB, {start}), the rest streamed per use",
            self.layers.first().copied().unwrap_or(0),
            self.layers.last().copied().unwrap_or(0),
            shared as f64 / (1u64 << 20) as f64,
            s.resident_experts,
            all,
            s.resident_bytes as f64 / (1u64 << 20) as f64,
        )
    }

    /// Reads every page kept resident (shared parts, output head, resident experts), so
    /// the first token does not fault them in.
    pub fn warm(&self) {
        let experts = self.layers.iter().flat_map(|&il| {
            (0..self.n_expert)
                .filter(move |&e| self.is_resident(il, e))
                .flat_map(move |e| self.ranges[il * self.n_expert + e].iter())
        });
        // Large preads first: expert tensors are hinted `Random`, so faults alone would
        // bring them in a page at a time.
        self.model
            .gguf()
            .load_pages(self.keep.iter().chain(experts));
        for flag in &self.unread {
            flag.store(false, Ordering::Relaxed);
        }
    }

    /// Re-plans the hot set from the counts now, as the router does every so many rows
    /// (after merging counts from elsewhere, or in tests).
    pub fn replan_now(&self) {
        let mut hot = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        self.replan(&mut hot);
    }

    /// Re-plans the hot set from the counts, swapping an expert in only for one used
    /// [`SWAP_MARGIN`] times less, and releases the experts that leave it.
    fn replan(&self, hot: &mut HotSet) {
        let ne = self.n_expert;
        let counts: Vec<Vec<u64>> = self.layers.iter().map(|&il| self.uses.layer(il)).collect();
        let score = |i: usize, e: usize| {
            let layer = &counts[i];
            (layer[e] as f64 + 1.0) / (layer.iter().sum::<u64>() as f64 + ne as f64)
        };
        // Resident experts, coldest first; the others, hottest first.
        let mut inside = Vec::new();
        let mut outside = Vec::new();
        for (i, &il) in self.layers.iter().enumerate() {
            for e in 0..ne {
                let s = score(i, e) / self.expert_bytes[il].max(1) as f64;
                if self.is_resident(il, e) {
                    inside.push((s, i, e));
                } else {
                    outside.push((s, i, e));
                }
            }
        }
        inside.sort_by(|a, b| a.0.total_cmp(&b.0));
        outside.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut changed = false;
        let mut out_iter = inside.into_iter();
        for (s_in, i, e) in outside {
            let il = self.layers[i];
            let bytes = self.expert_bytes[il];
            // Room already free takes it as it is.
            if hot.resident_bytes + bytes <= self.budget {
                self.promote(il, e);
                hot.resident_bytes += bytes;
                changed = true;
                continue;
            }
            let Some((s_out, j, f)) = out_iter.next() else {
                break;
            };
            if s_in < SWAP_MARGIN * s_out {
                break;
            }
            let jl = self.layers[j];
            self.resident[jl * ne + f].store(false, Ordering::Relaxed);
            hot.resident_bytes -= self.expert_bytes[jl];
            self.release_expert(jl, f);
            if hot.resident_bytes + bytes <= self.budget {
                self.promote(il, e);
                hot.resident_bytes += bytes;
            }
            changed = true;
        }
        if changed {
            self.replans.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Saves the use counts of this device's layers to its use file, when it keeps one
    /// (as dropping the cache does).
    pub fn save_uses(&self) {
        let Some(path) = &self.use_file else {
            return;
        };
        let counts = self.uses.snapshot();
        if let Err(why) = expert_use::save(path, self.model, &counts, &self.layers) {
            tracing::warn!("expert use counts not saved: {why}");
            eprintln!("warning: expert use counts not saved: {why}");
        }
    }

    /// Whether the first hot set came from the counts of earlier runs.
    pub fn learned(&self) -> bool {
        self.learned
    }

    /// The reads of layer `il`'s streamed experts `experts` (in index order) for a batch
    /// read in bulk: in groups of about [`ExpertCache::room`]'s half, each group's slabs
    /// tensor by tensor, neighbouring slabs merged into one range.
    fn bulk_reads(&self, il: usize, experts: &[usize]) -> Vec<Range<u64>> {
        let ne = self.n_expert;
        let bytes = self.expert_bytes[il].max(1);
        let per_group = (ExpertCache::room(self.model) / 2 / bytes).max(1) as usize;
        let mut out: Vec<Range<u64>> = Vec::new();
        for group in experts.chunks(per_group) {
            let n_slabs = group
                .iter()
                .map(|&e| self.ranges[il * ne + e].len())
                .max()
                .unwrap_or(0);
            for j in 0..n_slabs {
                let start = out.len();
                for &e in group {
                    let Some(r) = self.ranges[il * ne + e].get(j) else {
                        continue;
                    };
                    let len = out.len();
                    match out.last_mut() {
                        Some(last) if len > start && last.end == r.start => last.end = r.end,
                        _ => out.push(r.clone()),
                    }
                }
            }
        }
        out
    }

    /// Makes expert `e` of layer `il` resident; its pages are read at its next use.
    fn promote(&self, il: usize, e: usize) {
        let i = il * self.n_expert + e;
        self.unread[i].store(true, Ordering::Relaxed);
        self.resident[i].store(true, Ordering::Relaxed);
    }

    fn release_expert(&self, il: usize, e: usize) {
        let ranges = &self.ranges[il * self.n_expert + e];
        if let Some(reader) = &self.reader {
            reader.forget(ranges);
        }
        if self.release {
            for r in ranges {
                if let Err(e) = self.model.gguf().advise_pages(r.clone(), self.hint) {
                    // A hint the kernel refuses costs speed, never correctness.
                    tracing::debug!(hint = self.hint.name(), error = %e, "page hint refused");
                }
            }
        }
    }
}

impl Drop for ExpertCache<'_> {
    fn drop(&mut self) {
        self.save_uses();
    }
}

/// The byte ranges of `layers`' shared parts.
fn shared_ranges(model: &Model, layers: &[usize]) -> Vec<Range<u64>> {
    layers
        .iter()
        .flat_map(|&il| model.layer_shared_tensors(il))
        .map(|t| t.offset..t.offset + t.n_bytes)
        .collect()
}

impl ExpertPolicy for ExpertCache<'_> {
    fn routed(&self, layer: usize, routing: Routing<'_>) {
        self.uses.record(layer, routing);
        let d = self.model.hparams().n_embd.max(1);
        let bulk = self.reader.is_some()
            && self.bulk_mode != BulkMode::Off
            && routing.input().len() / d > BULK_ROWS;
        self.bulk.store(bulk, Ordering::Relaxed);
        let mut rows = 0;
        let mut streamed = Vec::new();
        let mut unread = Vec::new();
        for (e, r) in routing.chosen() {
            rows += r as u64;
            if self.is_resident(layer, e) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                let i = layer * self.n_expert + e;
                if self.reader.is_some() && self.unread[i].swap(false, Ordering::Relaxed) {
                    self.reading[i].store(true, Ordering::Relaxed);
                    unread.push(e);
                }
                continue;
            }
            self.misses.fetch_add(1, Ordering::Relaxed);
            self.streamed_bytes
                .fetch_add(self.expert_bytes[layer], Ordering::Relaxed);
            streamed.push(e);
        }
        if let Some(reader) = &self.reader {
            for &e in &unread {
                reader.read(&self.ranges[layer * self.n_expert + e]);
            }
            if bulk {
                reader.read(&self.bulk_reads(layer, &streamed));
            } else {
                for &e in &streamed {
                    reader.read(&self.ranges[layer * self.n_expert + e]);
                }
            }
        }
        if let Some(guesses) = &self.guesses {
            self.guess(guesses, layer, routing);
        }
        let total = self.routed_rows.fetch_add(rows, Ordering::Relaxed) + rows;
        if let Ok(mut hot) = self.hot.try_lock() {
            if total >= hot.planned_at + hot.interval {
                hot.planned_at = total;
                hot.interval = (2 * hot.interval).min(REPLAN_ROWS);
                self.replan(&mut hot);
            }
        }
    }

    fn computing(&self, layer: usize, expert: usize) {
        // A token's products would overtake the reader and fault the expert in a page at
        // a time (its pages are hinted random: no kernel read-ahead), each fault one small
        // read. Waiting for the reader's large reads costs the bytes at the disk's rate.
        // With promoted experts read the same way (`unread`), measured on the home lab's
        // d3 alone (300 MB/s, 94% hits, 32 tokens): 114k major faults → 16k, TPOT 434 →
        // 199 ms.
        let wait = match self.bulk.load(Ordering::Relaxed) {
            true => self.bulk_mode == BulkMode::Wait,
            false => self.token_wait,
        };
        let i = layer * self.n_expert + expert;
        if !wait || self.is_resident(layer, expert) && !self.reading[i].load(Ordering::Relaxed) {
            return;
        }
        if let Some(reader) = &self.reader {
            reader.wait_read(&self.ranges[layer * self.n_expert + expert]);
        }
    }

    fn computed(&self, layer: usize, expert: usize) {
        let i = layer * self.n_expert + expert;
        if !self.is_resident(layer, expert) {
            self.release_expert(layer, expert);
        } else if self.reading[i].swap(false, Ordering::Relaxed) {
            // Read in to stay: it no longer counts against the reader's room.
            if let Some(reader) = &self.reader {
                reader.forget(&self.ranges[i]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uniform_hot_set_spreads_over_the_layers() {
        // 3 layers of 4 experts of 10 bytes, 50 bytes: five experts, experts 0 of every
        // layer, then experts 1 of the first two.
        let set = hot_set(&[10, 10, 10], 4, None, 50);
        assert_eq!(
            set,
            [
                vec![true, true, false, false],
                vec![true, true, false, false],
                vec![true, false, false, false],
            ]
        );
        assert!((expected_hit_rate(3, 4, 10, None, 50) - 5.0 / 12.0).abs() < 1e-12);
        assert_eq!(expected_hit_rate(3, 4, 10, None, 1000), 1.0);
        assert_eq!(expected_hit_rate(3, 4, 10, None, 0), 0.0);
    }

    #[test]
    fn the_hottest_experts_are_kept_and_raise_the_hit_rate() {
        let counts = vec![vec![0, 90, 5, 5], vec![50, 0, 0, 50]];
        let set = hot_set(&[10, 10], 4, Some(&counts), 30);
        assert_eq!(
            set,
            [
                vec![false, true, false, false],
                vec![true, false, false, true]
            ]
        );
        let skewed = expected_hit_rate(2, 4, 10, Some(&counts), 30);
        let uniform = expected_hit_rate(2, 4, 10, None, 30);
        assert!(skewed > 0.8 && uniform < 0.4, "{skewed} {uniform}");
    }

    #[test]
    fn an_expert_larger_than_what_is_left_is_skipped() {
        // Layer 1's experts are 25 bytes: only layer 0's fit after the first.
        let set = hot_set(&[10, 25], 2, None, 40);
        assert_eq!(set, [vec![true, true], vec![false, false]]);
    }
}
