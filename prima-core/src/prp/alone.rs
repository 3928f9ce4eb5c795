//! A device running the whole model alone — a ring of one. When its weights do not fit its
//! memory it gets a ring device's treatment ([`Residency`]): the first layers stay
//! resident, the others are streamed in chunks, each read two chunks ahead of its use and
//! released right after it (MRU), instead of leaving the kernel's LRU to evict under a
//! cyclic access pattern, its worst case.
//!
//! When everything fits, [`LocalSession`] is a plain [`Session`]: no hint, no extra work.

use std::fmt;

use crate::generate::Forward;
use crate::model::{HyperParams, Model, ModelError, Session};
use crate::profile::{DeviceMemory, MemoryLimit, GIB};

use super::residency::Residency;

/// What the process still allocates after the budget is taken, besides the session's
/// buffers: thread stacks, the backend's scratch, the allocator's slack, output. What it
/// already holds (binary, plugins, tokenizer) is in the cgroup's usage, so not in the
/// available memory the budget starts from. Measured: SmolLM2 alone holds 25 MiB of
/// anonymous memory and 6 MiB of binary pages while generating; this is most of that
/// again as headroom, since running short costs a resident layer, running over costs the
/// LRU thrashing this module exists to avoid.
pub const PROCESS_OVERHEAD: u64 = 16 << 20;

/// `--mem-budget` as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemBudget {
    /// What the device has available (inside its cgroup limits) less [`memory_margin`].
    #[default]
    Auto,
    /// No budget: everything is treated as fitting (the kernel decides, as before).
    Off,
    /// Bytes of weights to keep in memory.
    Bytes(u64),
}

impl MemBudget {
    /// `auto`, `none`/`off`, or a size (`512M`, `2G`, a byte count).
    pub fn parse(text: &str) -> Result<MemBudget, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(MemBudget::Auto),
            "none" | "off" | "unlimited" => Ok(MemBudget::Off),
            _ => crate::manifest::parse_size(text)
                .map(MemBudget::Bytes)
                .map_err(|e| format!("{e}, or auto, or none")),
        }
    }
}

/// Where a budget came from.
#[derive(Debug, Clone, PartialEq)]
pub enum BudgetSource {
    /// `--mem-budget SIZE`.
    Flag,
    /// Available memory under the tightest cgroup limit.
    Cgroup(MemoryLimit),
    /// The host's MemAvailable (no cgroup limit below the host's memory).
    Host,
}

/// Bytes of weights a device alone may keep in memory, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightBudget {
    pub bytes: u64,
    pub source: BudgetSource,
    /// Available memory before the margin (`None` for a flag).
    pub available: Option<u64>,
    /// What was kept back for the KV cache, buffers and the process.
    pub margin: u64,
}

/// Memory a session needs besides weights: its KV cache for `n_ctx` positions of every
/// layer (F16, as the CPU backend keeps it), its activation buffers for `n_batch` tokens,
/// the backend's quantized copy of the widest activation, and [`PROCESS_OVERHEAD`]. The KV
/// cache is counted for the whole context although its pages are touched only as it
/// fills: a long conversation must not push weights out later.
pub fn memory_margin(hp: &HyperParams, n_ctx: usize, n_batch: usize) -> u64 {
    let kv = hp.n_layers * n_ctx * hp.n_head_kv * (hp.head_dim_k + hp.head_dim_v) * 2;
    let floats = n_batch
        * (3 * hp.n_embd
            + 2 * hp.q_dim()
            + 2 * hp.k_dim()
            + hp.v_dim()
            + hp.n_head * hp.head_dim_v
            + 2 * hp.n_ff)
        + hp.n_vocab;
    let quantized = n_batch * hp.n_ff.max(hp.n_embd);
    (kv + 4 * floats + quantized) as u64 + PROCESS_OVERHEAD
}

/// The budget `--mem-budget` asks for; `None` means no budget. `Auto` takes the
/// device's available memory (the cgroup's, where one limits it) less `margin`.
pub fn resolve_budget(
    arg: MemBudget,
    memory: Option<&DeviceMemory>,
    margin: u64,
) -> Option<WeightBudget> {
    match arg {
        MemBudget::Off => None,
        MemBudget::Bytes(bytes) => Some(WeightBudget {
            bytes,
            source: BudgetSource::Flag,
            available: None,
            margin: 0,
        }),
        // Memory that cannot be read is no limit, as everywhere in the profiles.
        MemBudget::Auto => memory.map(|m| {
            let available = (m.effective.available_gib * GIB) as u64;
            WeightBudget {
                bytes: available.saturating_sub(margin),
                source: match &m.cgroup {
                    Some(limit) => BudgetSource::Cgroup(limit.clone()),
                    None => BudgetSource::Host,
                },
                available: Some(available),
                margin,
            }
        }),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

impl fmt::Display for WeightBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "budget {} for weights", mib(self.bytes))?;
        let available = self.available.map(mib).unwrap_or_default();
        match &self.source {
            BudgetSource::Flag => write!(f, " (--mem-budget)"),
            BudgetSource::Cgroup(l) => write!(
                f,
                " ({} {}: limit {}, {available} available, less {} for KV cache, buffers and the process)",
                l.version.name(),
                l.path,
                mib(l.limit_bytes),
                mib(self.margin)
            ),
            BudgetSource::Host => write!(
                f,
                " (MemAvailable {available}, less {} for KV cache, buffers and the process)",
                mib(self.margin)
            ),
        }
    }
}

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
        "{} resident ({}) + embedding/output {}; {} streamed in {} chunks ({} read per token)",
        span(&resident),
        mib(resident_bytes),
        mib(model.global_bytes()),
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
}

impl<'m> LocalSession<'m> {
    /// Runs `session` under `residency`, which is dropped when it streams nothing.
    pub fn new(session: Session<'m>, residency: Option<Residency>) -> LocalSession<'m> {
        LocalSession {
            session,
            residency: residency.filter(Residency::streams),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{CgroupVersion, MemInfo};

    fn memory(available_gib: f64, cgroup: Option<MemoryLimit>) -> DeviceMemory {
        let info = MemInfo {
            total_gib: 16.0,
            available_gib,
            swap_total_gib: 0.0,
            swap_free_gib: 0.0,
        };
        DeviceMemory {
            effective: info,
            host: info,
            cgroup,
        }
    }

    #[test]
    fn the_flag_parses_sizes_auto_and_none() {
        assert_eq!(MemBudget::parse("auto"), Ok(MemBudget::Auto));
        assert_eq!(MemBudget::parse("None"), Ok(MemBudget::Off));
        assert_eq!(MemBudget::parse("off"), Ok(MemBudget::Off));
        assert_eq!(MemBudget::parse("300M"), Ok(MemBudget::Bytes(300 << 20)));
        let err = MemBudget::parse("lots").unwrap_err();
        assert!(err.contains("auto") && err.contains("none"), "{err}");
    }

    #[test]
    fn auto_is_what_is_available_less_the_margin() {
        let limit = MemoryLimit {
            version: CgroupVersion::V1,
            path: "/prima".into(),
            limit_bytes: 500 << 20,
            available_bytes: 480 << 20,
        };
        let m = memory(480.0 / 1024.0, Some(limit.clone()));
        let b = resolve_budget(MemBudget::Auto, Some(&m), 100 << 20).unwrap();
        assert_eq!(b.bytes, 380 << 20);
        assert_eq!(b.source, BudgetSource::Cgroup(limit));
        assert!(b.to_string().contains("cgroup v1 /prima"), "{b}");

        // Less available than the margin: nothing for weights, every layer streamed.
        let tight = memory(0.05, None);
        let b = resolve_budget(MemBudget::Auto, Some(&tight), 100 << 20).unwrap();
        assert_eq!((b.bytes, b.source), (0, BudgetSource::Host));

        // Unreadable memory figures and `none` are no budget; a size is taken as is.
        assert_eq!(resolve_budget(MemBudget::Auto, None, 1), None);
        assert_eq!(resolve_budget(MemBudget::Off, Some(&m), 1), None);
        let b = resolve_budget(MemBudget::Bytes(123), Some(&m), 1).unwrap();
        assert_eq!((b.bytes, b.margin), (123, 0));
    }

    #[test]
    fn the_margin_counts_the_whole_kv_cache() {
        let hp = HyperParams {
            arch: crate::model::Architecture::Llama,
            n_layers: 22,
            n_ctx_train: 2048,
            n_embd: 2048,
            n_ff: 5632,
            n_head: 32,
            n_head_kv: 4,
            head_dim_k: 64,
            head_dim_v: 64,
            n_vocab: 32000,
            rms_eps: 1e-5,
            rope_freq_base: 10000.0,
            n_rot: 64,
            rope_scaling: crate::model::RopeScaling::None,
            attention_scale: 0.125,
            sliding_window: 0,
            local_layers: Vec::new(),
            rope_freq_base_local: 10000.0,
        };
        let short = memory_margin(&hp, 256, 1);
        let long = memory_margin(&hp, 4096, 1);
        // 22 layers × 3840 positions × 4 heads × 128 dims × 2 bytes.
        assert_eq!(long - short, 22 * 3840 * 4 * 128 * 2);
        assert!(short > PROCESS_OVERHEAD);
    }
}
