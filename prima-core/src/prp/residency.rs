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

use crate::gguf::PageHint;
use crate::model::{Model, ModelError, Session};

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
}

/// Sorted, merged byte ranges of the tensors of `layers` (gaps under a page are bridged).
fn layer_ranges(model: &Model, layers: impl Iterator<Item = usize>) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> = layers
        .flat_map(|il| model.layer_tensors(il))
        .map(|t| t.offset..t.offset + t.n_bytes)
        .collect();
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

impl Residency {
    /// Plans residency for `windows` (in execution order): layers are kept resident in
    /// execution order while their bytes fit `budget`, the rest are streamed. No budget:
    /// everything resident.
    pub fn plan(
        model: &Model,
        windows: &[RoundWindow],
        budget: Option<u64>,
        prefetch: bool,
        release: ReleasePolicy,
        method: ReleaseMethod,
    ) -> Residency {
        let mut used = 0u64;
        let windows = windows
            .iter()
            .map(|w| {
                let (mut resident, mut streamed) = (Vec::new(), Vec::new());
                let mut streamed_bytes = 0;
                for il in w.layers.clone() {
                    let b = model.layer_bytes(il);
                    if budget.is_none_or(|budget| used + b <= budget) && streamed.is_empty() {
                        used += b;
                        resident.push(il);
                    } else {
                        streamed_bytes += b;
                        streamed.push(il);
                    }
                }
                WindowPages {
                    round: w.round,
                    layers: w.layers.clone(),
                    resident_ranges: layer_ranges(model, resident.into_iter()),
                    streamed_ranges: layer_ranges(model, streamed.into_iter()),
                    bytes: w.layers.clone().map(|il| model.layer_bytes(il)).sum(),
                    streamed_bytes,
                }
            })
            .collect();
        Residency {
            windows,
            prefetch,
            release,
            hint: match method {
                ReleaseMethod::Pageout => PageHint::PageOut,
                ReleaseMethod::Cold => PageHint::Cold,
                ReleaseMethod::Dontneed => PageHint::DontNeed,
            },
        }
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
    /// timing it and counting the major faults it took.
    pub fn run_round(
        &self,
        session: &mut Session<'_>,
        meter: &PassMeter,
        round: usize,
    ) -> Result<WindowRun, ModelError> {
        let faults_before = meter.major_faults();
        let computing = std::time::Instant::now();
        let index = self.index_of_round(round);
        if let Some(i) = index {
            session.run_layers(self.windows[i].layers.clone())?;
            // The next device computes now; idle workers here would take its cores.
            session.idle();
        }
        Ok(WindowRun {
            index,
            compute_ms: computing.elapsed().as_secs_f64() * 1e3,
            major_faults: meter.major_faults().saturating_sub(faults_before),
        })
    }

    /// The window run in `round`, by index.
    pub fn index_of_round(&self, round: usize) -> Option<usize> {
        self.windows.iter().position(|w| w.round == round)
    }

    /// Reads every resident page (so the first token does not fault them in) and starts
    /// reading the first streamed layers.
    pub fn warm(&self, model: &Model) {
        const PAGE: usize = 4096;
        let bytes = model.gguf().bytes();
        let mut checksum = 0u8;
        for r in self.windows.iter().flat_map(|w| &w.resident_ranges) {
            let end = (r.end as usize).min(bytes.len());
            for page in bytes[r.start as usize..end].chunks(PAGE) {
                checksum ^= page[0];
            }
        }
        std::hint::black_box(checksum);
        if let Some(first) = self.windows.iter().find(|w| !w.fully_resident()) {
            self.advise(model, &first.streamed_ranges, PageHint::WillNeed);
        }
    }

    /// After window `index` has run: release its streamed layers (MRU), and prefetch the
    /// next window's streamed layers if prefetching is on. Without a budget nothing is
    /// streamed and no hint is given.
    pub fn after_window(&self, model: &Model, index: usize) {
        let Some(w) = self.windows.get(index) else {
            return;
        };
        let released = self.release == ReleasePolicy::Mru && !w.fully_resident();
        if released {
            self.advise(model, &w.streamed_ranges, self.hint);
        }
        let next = (index + 1) % self.windows.len();
        let n = &self.windows[next];
        if self.prefetch && !n.fully_resident() && !(next == index && released) {
            self.advise(model, &n.streamed_ranges, PageHint::WillNeed);
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
