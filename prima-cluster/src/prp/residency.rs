//! Which of a device's layer windows stay in memory, and the page-cache hints that keep it
//! so: prefetch the next window while other devices work, release a streamed window right
//! after use.
//!
//! A device runs its windows in the same cyclic order every token. Under a memory budget
//! that cannot hold them all, the kernel's LRU evicts exactly the pages needed soonest
//! (cyclic access is LRU's worst case). Prima keeps the first windows that fit *resident*
//! and *streams* the rest: after a streamed window is computed, its pages are released
//! (it is the most recently used window, so it is needed furthest in the future), which
//! makes room for the prefetch of the next one instead of evicting a resident window.

use std::ops::Range;
use std::sync::Arc;

use prima_core::gguf::{PageHint, ReadAhead, TensorInfo};
use prima_core::model::{Model, ModelError, Session};

use super::counters::PassMeter;

use super::protocol::{ReleaseMethod, ReleasePolicy, RoundWindow};

/// The pages of one window, split into the layers kept resident and those streamed.
#[derive(Debug, Clone)]
pub struct WindowPages {
    pub round: usize,
    pub layers: Range<usize>,
    /// File byte ranges of the resident layers' tensors, sorted and merged.
    pub resident_ranges: Vec<Range<u64>>,
    /// File byte ranges of the streamed layers' tensors (read each token, then released).
    pub streamed_ranges: Vec<Range<u64>>,
    pub bytes: u64,
    pub streamed_bytes: u64,
}

impl WindowPages {
    pub fn fully_resident(&self) -> bool {
        self.streamed_ranges.is_empty()
    }
}

/// The page hints a plan gives.
#[derive(Debug, Clone, Copy)]
struct Hints {
    prefetch: bool,
    release: ReleasePolicy,
    method: ReleaseMethod,
    lookahead: usize,
    /// What the read-ahead thread may hold: the budget the resident layers leave.
    read_ahead_cap: u64,
}

/// What running one round's window cost (nothing for a relay).
#[derive(Debug, Clone, Copy)]
pub struct WindowRun {
    /// The window run, by index; `None` when the device only relays this round.
    pub index: Option<usize>,
    pub compute_ms: f64,
    pub major_faults: u64,
}

/// A device's windows and what it does with their pages.
#[derive(Debug, Clone)]
pub struct Residency {
    windows: Vec<WindowPages>,
    prefetch: bool,
    release: ReleasePolicy,
    hint: PageHint,
    /// How many windows ahead a prefetch reaches: 1 on a ring (the next window is read
    /// while the other devices compute), 2 on a device alone (the chunk after next is
    /// read while the next one, already read, is computed).
    lookahead: usize,
    /// Byte ranges outside the layers that this device reads every token and keeps
    /// resident (the output head of a device alone; a token reads one row of the embedding), read by `warm`.
    global_ranges: Vec<Range<u64>>,
    /// The thread that prefetches streamed windows (when prefetching and streaming);
    /// shared by clones of this plan.
    reader: Option<Arc<ReadAhead>>,
}

/// The streamed chunk a device alone reads at once, at most: big enough that the disk
/// sees long requests. A tight budget takes smaller chunks (an eighth of what the budget
/// leaves for layers), since two chunks in flight displace resident layers; a chunk is
/// never less than one layer.
pub const CHUNK_BYTES: u64 = 16 << 20;

/// How a device running the whole model alone splits it under a memory budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AloneSplit {
    /// Layers `0..resident` stay in memory.
    pub resident: usize,
    /// The other layers, in chunks streamed one after the other (empty when all fits).
    pub chunks: Vec<Range<usize>>,
}

/// Splits a model of `layer_bytes` (per layer, in execution order) and `global_bytes` of
/// other weights (embedding, output head: always resident) under `budget` bytes.
///
/// When everything fits, every layer is resident. Otherwise the streamed layers go in
/// chunks of the same number of layers (about [`CHUNK_BYTES`], less under a tight budget)
/// and room for two chunks is kept out of the budget (one being computed, the next being
/// read); the first layers that fit in what is left stay resident. A budget smaller than
/// the global weights and that room streams every layer.
pub fn split_alone(layer_bytes: &[u64], global_bytes: u64, budget: u64) -> AloneSplit {
    let n = layer_bytes.len();
    let total: u64 = global_bytes + layer_bytes.iter().sum::<u64>();
    if total <= budget || n == 0 {
        return AloneSplit {
            resident: n,
            chunks: Vec::new(),
        };
    }
    let largest = layer_bytes.iter().copied().max().unwrap_or(0).max(1);
    let for_layers = budget.saturating_sub(global_bytes);
    let chunk_bytes = CHUNK_BYTES.min(for_layers / 8);
    let per_chunk = chunk_bytes.div_ceil(largest).clamp(1, n as u64) as usize;
    let room = 2 * per_chunk as u64 * largest;
    let mut left = for_layers.saturating_sub(room);
    let mut resident = 0;
    for &b in layer_bytes {
        if b > left {
            break;
        }
        left -= b;
        resident += 1;
    }
    // Everything but the room fits, and the room holds more than the layers it leaves
    // out, so some layer is always streamed here; `min` only keeps that obvious.
    let resident = resident.min(n - 1);
    let chunks = (resident..n)
        .step_by(per_chunk)
        .map(|start| start..(start + per_chunk).min(n))
        .collect();
    AloneSplit { resident, chunks }
}

/// Spreads `n` streamed layers over windows of `lens` layers as evenly as they allow
/// (water-filling: no window streams more than it has, the rest go to the longer ones).
fn spread(n: usize, lens: &[usize]) -> Vec<usize> {
    let mut out = vec![0; lens.len()];
    let mut left = n.min(lens.iter().sum());
    while left > 0 {
        let open: Vec<usize> = (0..lens.len()).filter(|&i| out[i] < lens[i]).collect();
        let each = (left / open.len()).max(1);
        for &i in &open {
            let add = each.min(lens[i] - out[i]).min(left);
            out[i] += add;
            left -= add;
            if left == 0 {
                break;
            }
        }
    }
    out
}

/// Sorted, merged byte ranges of `tensors` (gaps under a page are bridged).
fn merged_ranges<'a>(tensors: impl Iterator<Item = &'a TensorInfo>) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> = tensors.map(|t| t.offset..t.offset + t.n_bytes).collect();
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.start <= last.end + 4096 => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// Sorted, merged byte ranges of the tensors of `layers`.
fn layer_ranges(model: &Model, layers: impl Iterator<Item = usize>) -> Vec<Range<u64>> {
    merged_ranges(layers.flat_map(|il| model.layer_tensors(il)))
}

impl Residency {
    /// Plans residency for `windows` (in execution order, one per round) under `budget`
    /// bytes of weights (no budget: everything resident).
    ///
    /// When they do not all fit, each window streams its first layers and keeps the rest
    /// resident, with the streamed layers spread as evenly as the windows allow: a device
    /// waits between its rounds while the others compute, and the read-ahead thread fills
    /// the room the resident layers leave with the next round's streamed layers then: with
    /// k ≥ 2 rounds and a room of E/(k − 1) for an excess E, the streaming hides behind
    /// the other devices (the paper's PRP); at k = 1 only the room's worth does. Streamed
    /// layers come first in their window so that, once used and released, the reader
    /// starts on the next round while the resident ones compute.
    pub fn plan(
        model: &Model,
        windows: &[RoundWindow],
        budget: Option<u64>,
        prefetch: bool,
        release: ReleasePolicy,
        method: ReleaseMethod,
    ) -> Residency {
        Residency::plan_split(model, windows, &[], budget, prefetch, release, method)
    }

    /// [`Residency::plan`] for a device whose `gpu_layers` run on its GPU (the paper's
    /// n_m): their weights live in VRAM, so they are left out of the RAM budget and never
    /// streamed (their pages are read once, when the GPU backend copies them); the
    /// streamed layers are a window's first CPU layers.
    pub fn plan_split(
        model: &Model,
        windows: &[RoundWindow],
        gpu_layers: &[usize],
        budget: Option<u64>,
        prefetch: bool,
        release: ReleasePolicy,
        method: ReleaseMethod,
    ) -> Residency {
        let n_layers = model.hparams().n_layers;
        let on_gpu = |il: usize| gpu_layers.contains(&il);
        let held: Vec<usize> = windows
            .iter()
            .flat_map(|w| w.layers.clone())
            .filter(|&il| !on_gpu(il))
            .collect();
        let layer_bytes = |il: usize| model.layer_bytes(il);
        let total: u64 = held.iter().map(|&il| layer_bytes(il)).sum();
        let budget = budget.unwrap_or(u64::MAX);
        let mut resident = vec![false; n_layers];
        // A window's CPU layers, in order: the ones that may be streamed.
        let cpu_of = |w: &RoundWindow| w.layers.clone().filter(|&il| !on_gpu(il));
        let lens: Vec<usize> = windows.iter().map(|w| cpu_of(w).count()).collect();
        let streamed_per_window = if total <= budget {
            vec![0; windows.len()]
        } else {
            // Room R for one round's reads: at least the largest layer, and the excess
            // E spread over the k − 1 other rounds' waits, R = E/(k − 1), so that the
            // reads of k rounds, E + R, hide behind the waits; then as few streamed
            // layers as leave the resident ones within B − R.
            let largest = held.iter().map(|&il| layer_bytes(il)).max().unwrap_or(1);
            let excess = total - budget;
            let rounds = windows.len() as u64;
            let room = if rounds >= 2 {
                largest.max(excess.div_ceil(rounds - 1))
            } else {
                largest
            };
            let keep = budget.saturating_sub(room);
            let mut streamed = 0;
            loop {
                let per_window = spread(streamed, &lens);
                let resident_bytes: u64 = windows
                    .iter()
                    .zip(&per_window)
                    .flat_map(|(w, &s)| cpu_of(w).skip(s))
                    .map(layer_bytes)
                    .sum();
                if resident_bytes <= keep || streamed >= held.len() {
                    break per_window;
                }
                streamed += 1;
            }
        };
        let mut pieces = Vec::new();
        for (w, &streamed) in windows.iter().zip(&streamed_per_window) {
            // GPU layers stay; the first `streamed` CPU layers are streamed, one piece
            // each; each run of resident layers between them is one piece.
            let streamed_set: Vec<usize> = cpu_of(w).take(streamed).collect();
            let mut run_start = None;
            for il in w.layers.clone() {
                if streamed_set.contains(&il) {
                    if let Some(start) = run_start.take() {
                        pieces.push(RoundWindow {
                            round: w.round,
                            layers: start..il,
                        });
                    }
                    pieces.push(RoundWindow {
                        round: w.round,
                        layers: il..il + 1,
                    });
                } else {
                    resident[il] = true;
                    run_start.get_or_insert(il);
                }
            }
            if let Some(start) = run_start {
                pieces.push(RoundWindow {
                    round: w.round,
                    layers: start..w.layers.end,
                });
            }
        }
        let resident_bytes: u64 = held
            .iter()
            .filter(|&&il| resident[il])
            .map(|&il| layer_bytes(il))
            .sum();
        let hints = Hints {
            prefetch,
            release,
            method,
            lookahead: 1,
            read_ahead_cap: budget.saturating_sub(resident_bytes),
        };
        Residency::build(model, &pieces, &resident, hints)
    }

    /// Plans residency for a device running every layer alone under `budget` bytes for
    /// all its weights, output head included ([`split_alone`]): a resident
    /// window, then streamed chunks, each read two chunks ahead of its use.
    pub fn plan_alone(
        model: &Model,
        budget: u64,
        prefetch: bool,
        release: ReleasePolicy,
        method: ReleaseMethod,
    ) -> Residency {
        let n = model.hparams().n_layers;
        let layer_bytes: Vec<u64> = (0..n).map(|il| model.layer_bytes(il)).collect();
        let split = split_alone(&layer_bytes, model.read_whole_bytes(), budget);
        let windows: Vec<RoundWindow> = std::iter::once(0..split.resident)
            .filter(|r| !r.is_empty())
            .chain(split.chunks.iter().cloned())
            .enumerate()
            .map(|(round, layers)| RoundWindow { round, layers })
            .collect();
        let resident: Vec<bool> = (0..n).map(|il| il < split.resident).collect();
        let kept: u64 =
            model.read_whole_bytes() + layer_bytes[..split.resident].iter().sum::<u64>();
        let hints = Hints {
            prefetch,
            release,
            method,
            lookahead: 2,
            read_ahead_cap: budget.saturating_sub(kept),
        };
        let mut plan = Residency::build(model, &windows, &resident, hints);
        plan.global_ranges = merged_ranges(model.read_whole_tensors());
        plan
    }

    /// Keeps the output head (final norm and output matrix) resident beside the windows and
    /// reads it before the first token: for the device that runs the output layer.
    pub fn keep_output_head(&mut self, model: &Model) {
        self.global_ranges = merged_ranges(model.read_whole_tensors());
    }

    fn build(model: &Model, windows: &[RoundWindow], resident: &[bool], hints: Hints) -> Residency {
        let is_resident = |il: usize| resident.get(il).copied().unwrap_or(false);
        let windows: Vec<WindowPages> = windows
            .iter()
            .map(|w| {
                let streamed = w.layers.clone().filter(|&il| !is_resident(il));
                WindowPages {
                    round: w.round,
                    layers: w.layers.clone(),
                    resident_ranges: layer_ranges(
                        model,
                        w.layers.clone().filter(|&il| is_resident(il)),
                    ),
                    streamed_ranges: layer_ranges(model, streamed.clone()),
                    bytes: w.layers.clone().map(|il| model.layer_bytes(il)).sum(),
                    streamed_bytes: streamed.map(|il| model.layer_bytes(il)).sum(),
                }
            })
            .collect();
        let streams = windows.iter().any(|w: &WindowPages| !w.fully_resident());
        let reader = if hints.prefetch && streams {
            match model.gguf().read_ahead(hints.read_ahead_cap) {
                Ok(r) => r.map(Arc::new),
                Err(e) => {
                    // Without the thread, prefetches fall back to the kernel's hint.
                    tracing::warn!(error = %e, "could not start the read-ahead thread");
                    None
                }
            }
        } else {
            None
        };
        Residency {
            windows,
            reader,
            prefetch: hints.prefetch,
            release: hints.release,
            hint: match hints.method {
                ReleaseMethod::Pageout => PageHint::PageOut,
                ReleaseMethod::Cold => PageHint::Cold,
                ReleaseMethod::Dontneed => PageHint::DontNeed,
            },
            lookahead: hints.lookahead,
            global_ranges: Vec::new(),
        }
    }

    /// Whether any layer is streamed.
    pub fn streams(&self) -> bool {
        self.windows.iter().any(|w| !w.fully_resident())
    }

    pub fn windows(&self) -> &[WindowPages] {
        &self.windows
    }

    /// Windows held in memory entirely.
    pub fn resident_count(&self) -> usize {
        self.windows.iter().filter(|w| w.fully_resident()).count()
    }

    /// Windows with at least one streamed layer.
    pub fn streamed_count(&self) -> usize {
        self.windows.len() - self.resident_count()
    }

    /// Bytes read from storage each token when streaming works as planned.
    pub fn streamed_bytes(&self) -> u64 {
        self.windows.iter().map(|w| w.streamed_bytes).sum()
    }

    /// Runs this device's window of `round` (if it has one) over the batch in `session`,
    /// timing it and counting the major faults it took. A window cut into streamed chunks
    /// runs chunk by chunk, each but the last released (and the next prefetched) as soon as
    /// it is done; the caller does that for the last one, `index`, after passing the
    /// activations on.
    pub fn run_round(
        &self,
        model: &Model,
        session: &mut Session<'_>,
        meter: &PassMeter,
        round: usize,
    ) -> Result<WindowRun, ModelError> {
        let faults_before = meter.major_faults();
        let computing = std::time::Instant::now();
        let pieces: Vec<usize> = (0..self.windows.len())
            .filter(|&i| self.windows[i].round == round)
            .collect();
        for (n, &i) in pieces.iter().enumerate() {
            session.run_layers(self.windows[i].layers.clone())?;
            if n + 1 < pieces.len() {
                self.after_window(model, i);
            }
        }
        if !pieces.is_empty() {
            // The next device computes now; idle workers here would take its cores.
            session.idle();
        }
        Ok(WindowRun {
            index: pieces.last().copied(),
            compute_ms: computing.elapsed().as_secs_f64() * 1e3,
            major_faults: meter.major_faults().saturating_sub(faults_before),
        })
    }

    /// Reads every resident page (so the first token does not fault them in) and starts
    /// reading the first streamed windows, as many as a prefetch reaches ahead.
    pub fn warm(&self, model: &Model) {
        let resident = self.windows.iter().flat_map(|w| &w.resident_ranges);
        model
            .gguf()
            .load_pages(self.global_ranges.iter().chain(resident));
        match &self.reader {
            // The reader holds one token's streamed layers in order, and reads as far
            // as its cap lets it; each is queued again for the next token once used.
            Some(reader) => {
                for w in self.windows.iter().filter(|w| !w.fully_resident()) {
                    reader.read(&w.streamed_ranges);
                }
            }
            None => {
                for w in self
                    .windows
                    .iter()
                    .filter(|w| !w.fully_resident())
                    .take(self.lookahead)
                {
                    self.advise(model, &w.streamed_ranges, PageHint::WillNeed);
                }
            }
        }
    }

    /// After window `index` has run: release its streamed layers (MRU), and, if
    /// prefetching is on, queue them on the read-ahead thread again for the next token
    /// (without the thread, hint the streamed layers of the window `lookahead` places on).
    /// Without a budget nothing is streamed and no hint is given.
    pub fn after_window(&self, model: &Model, index: usize) {
        let Some(w) = self.windows.get(index) else {
            return;
        };
        if w.fully_resident() {
            return;
        }
        if let Some(reader) = &self.reader {
            // Used: what the reader holds of it no longer counts, and it is next needed a
            // token from now, after every other streamed window.
            reader.forget(&w.streamed_ranges);
        }
        let released = self.release == ReleasePolicy::Mru;
        if released {
            self.advise(model, &w.streamed_ranges, self.hint);
        }
        if !self.prefetch {
            return;
        }
        match &self.reader {
            Some(reader) => reader.read(&w.streamed_ranges),
            None => {
                let len = self.windows.len();
                let next = (index + self.lookahead.min(len - 1)) % len;
                let n = &self.windows[next];
                let just_released = next == index && released;
                if !n.fully_resident() && !just_released {
                    self.advise(model, &n.streamed_ranges, PageHint::WillNeed);
                }
            }
        }
    }

    fn advise(&self, model: &Model, ranges: &[Range<u64>], hint: PageHint) {
        for r in ranges {
            if let Err(e) = model.gguf().advise_pages(r.clone(), hint) {
                // A hint the kernel refuses costs speed, never correctness.
                tracing::debug!(hint = hint.name(), error = %e, "page hint refused");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn streamed_layers_spread_evenly_over_the_rounds() {
        assert_eq!(spread(6, &[5, 5, 5, 5]), vec![2, 2, 1, 1]);
        assert_eq!(spread(0, &[3, 3]), vec![0, 0]);
        // A short window streams all it has; the rest go to the longer ones.
        assert_eq!(spread(7, &[1, 5, 5]), vec![1, 3, 3]);
        // Never more than the windows hold.
        assert_eq!(spread(99, &[2, 3]), vec![2, 3]);
    }

    #[test]
    fn everything_that_fits_is_resident() {
        let layers = [10 * MIB; 4];
        let all = split_alone(&layers, 5 * MIB, 45 * MIB);
        assert_eq!((all.resident, all.chunks.len()), (4, 0));
        assert_eq!(
            split_alone(&[], 5 * MIB, 0).chunks,
            Vec::<Range<usize>>::new()
        );
    }

    #[test]
    fn the_first_layers_stay_resident_beside_room_for_two_chunks() {
        // 22 layers of 48 MiB and 100 MiB of embedding/output under a 480 MiB budget:
        // chunks of one layer (48 MiB ≥ 16 MiB), room for two (96 MiB), which leaves
        // 284 MiB: five layers resident, seventeen streamed one by one.
        let layers = [48 * MIB; 22];
        let s = split_alone(&layers, 100 * MIB, 480 * MIB);
        assert_eq!(s.resident, 5);
        assert_eq!(s.chunks.len(), 17);
        assert_eq!(s.chunks[0], 5..6);
        assert_eq!(s.chunks.last(), Some(&(21..22)));
    }

    #[test]
    fn small_layers_are_streamed_in_chunks_that_cover_every_layer_once() {
        // 2 MiB layers: 16 MiB chunks of 8 layers when the budget is roomy (150 MiB:
        // 32 MiB of room, 59 layers resident) ...
        let roomy = split_alone(&[2 * MIB; 100], 0, 150 * MIB);
        assert_eq!((roomy.resident, roomy.chunks[0].len()), (59, 8));
        assert_eq!(roomy.chunks.last(), Some(&(99..100)));
        // ... and smaller ones when it is tight: 32 MiB for layers → 4 MiB chunks of 2,
        // 8 MiB of room, 12 layers resident.
        let tight = split_alone(&[2 * MIB; 30], 8 * MIB, 40 * MIB);
        assert_eq!((tight.resident, tight.chunks[0].len()), (12, 2));
        for (s, n) in [(&roomy, 100), (&tight, 30)] {
            let covered: Vec<usize> = s.chunks.iter().flat_map(|c| c.clone()).collect();
            assert_eq!(covered, (s.resident..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_budget_below_the_global_weights_streams_every_layer() {
        let layers = [10 * MIB; 6];
        for budget in [0, 1, 50 * MIB] {
            let s = split_alone(&layers, 50 * MIB, budget);
            assert_eq!(s.resident, 0, "budget {budget}");
            assert_eq!(s.chunks.len(), 6);
        }
    }
}
