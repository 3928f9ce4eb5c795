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
use crate::model::Model;

use super::protocol::{ReleaseMethod, ReleasePolicy, RoundWindow};

/// The pages of one window.
#[derive(Debug, Clone)]
pub struct WindowPages {
    pub round: usize,
    pub layers: Range<usize>,
    /// File byte ranges of its tensors, sorted and merged.
    pub ranges: Vec<Range<u64>>,
    pub bytes: u64,
    /// Kept in memory for good (else streamed).
    pub resident: bool,
}

/// A device's windows and what it does with their pages.
#[derive(Debug, Clone)]
pub struct Residency {
    windows: Vec<WindowPages>,
    prefetch: bool,
    release: ReleasePolicy,
    hint: PageHint,
}

impl Residency {
    /// Plans residency for `windows` (in execution order): the first windows whose bytes
    /// fit `budget` together are resident, the rest streamed. No budget: all resident.
    pub fn plan(
        model: &Model,
        windows: &[RoundWindow],
        budget: Option<u64>,
        prefetch: bool,
        release: ReleasePolicy,
        method: ReleaseMethod,
    ) -> Residency {
        let mut used = 0u64;
        let mut fits = true;
        let windows = windows
            .iter()
            .map(|w| {
                let mut ranges: Vec<Range<u64>> = w
                    .layers
                    .clone()
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
                let bytes = w.layers.clone().map(|il| model.layer_bytes(il)).sum();
                fits = fits && budget.is_none_or(|b| used + bytes <= b);
                if fits {
                    used += bytes;
                }
                WindowPages {
                    round: w.round,
                    layers: w.layers.clone(),
                    ranges: merged,
                    bytes,
                    resident: fits,
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

    pub fn resident_count(&self) -> usize {
        self.windows.iter().filter(|w| w.resident).count()
    }

    pub fn streamed_count(&self) -> usize {
        self.windows.len() - self.resident_count()
    }

    /// The window run in `round`, by index.
    pub fn index_of_round(&self, round: usize) -> Option<usize> {
        self.windows.iter().position(|w| w.round == round)
    }

    /// Reads every page of the resident windows (so the first token does not fault them
    /// in) and starts reading the first streamed one.
    pub fn warm(&self, model: &Model) {
        const PAGE: usize = 4096;
        let bytes = model.gguf().bytes();
        let mut checksum = 0u8;
        for w in self.windows.iter().filter(|w| w.resident) {
            for r in &w.ranges {
                let end = (r.end as usize).min(bytes.len());
                for page in bytes[r.start as usize..end].chunks(PAGE) {
                    checksum ^= page[0];
                }
            }
        }
        std::hint::black_box(checksum);
        if let Some(first) = self.windows.iter().find(|w| !w.resident) {
            self.advise(model, first, PageHint::WillNeed);
        }
    }

    /// After window `index` has run: release it if it is streamed (MRU), and prefetch the
    /// next window in cyclic order if it is streamed and prefetching is on. Without a
    /// budget every window is resident and no hint is given.
    pub fn after_window(&self, model: &Model, index: usize) {
        let Some(w) = self.windows.get(index) else {
            return;
        };
        let released = self.release == ReleasePolicy::Mru && !w.resident;
        if released {
            self.advise(model, w, self.hint);
        }
        let next = (index + 1) % self.windows.len();
        let n = &self.windows[next];
        if self.prefetch && !n.resident && !(next == index && released) {
            self.advise(model, n, PageHint::WillNeed);
        }
    }

    fn advise(&self, model: &Model, w: &WindowPages, hint: PageHint) {
        for r in &w.ranges {
            if let Err(e) = model.gguf().advise_pages(r.clone(), hint) {
                // A hint the kernel refuses costs speed, never correctness.
                tracing::debug!(hint = hint.name(), error = %e, "page hint refused");
            }
        }
    }
}
