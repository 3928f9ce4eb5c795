//! How many bytes of weights a device keeps in memory: `--mem-budget auto|none|SIZE`, and
//! for `auto` what the device has available (inside its cgroup limits) less what the
//! session needs besides weights. A device alone and a ring device plan their
//! [`Residency`](super::residency::Residency) with the same budget.

use std::fmt;

use crate::profile::{DeviceMemory, MemoryLimit, GIB};
use prima_core::model::{HyperParams, Model};

use super::residency::Residency;

/// What the process still allocates after the budget is taken, besides the session's
/// buffers: thread stacks, the backend's scratch, the allocator's slack, output. What it
/// already holds (binary, plugins, tokenizer) is in the cgroup's usage, so not in the
/// available memory the budget starts from. Measured: SmolLM2 alone holds 25 MiB of
/// anonymous memory and 6 MiB of binary pages while generating; this is most of that
/// again as headroom, since running short costs a resident layer, running over costs the
/// LRU thrashing this module exists to avoid.
pub const PROCESS_OVERHEAD: u64 = 16 << 20;

/// Rows of activation buffers counted in the margin (see [`memory_margin_for_layers`]).
pub const MARGIN_BATCH_ROWS: usize = 64;

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
            _ => prima_host::parse_size(text)
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
/// layer in each of its `n_slots` slots (F16, as the CPU backend keeps it), its activation buffers for `n_batch` tokens,
/// the backend's quantized copy of the widest activation, and [`PROCESS_OVERHEAD`]. The KV
/// cache is counted for the whole context although its pages are touched only as it
/// fills: a long conversation must not push weights out later.
pub fn memory_margin(hp: &HyperParams, n_ctx: usize, n_batch: usize, n_slots: usize) -> u64 {
    memory_margin_for_layers(hp, hp.n_layers, n_ctx, n_batch, n_slots)
}

/// [`memory_margin`] of a ring device whose KV caches hold `n_layers` layers.
pub fn memory_margin_for_layers(
    hp: &HyperParams,
    n_layers: usize,
    n_ctx: usize,
    n_batch: usize,
    n_slots: usize,
) -> u64 {
    // One cache per slot (continuous batching), each of the whole context. The activation
    // buffers below do not grow with slots: a batch holds `n_batch` rows, all slots together.
    // Saturating: a setup's n_ctx and n_slots come from the wire.
    let kv = [
        n_slots,
        n_layers,
        n_ctx,
        hp.n_head_kv,
        hp.head_dim_k + hp.head_dim_v,
        2,
    ]
    .iter()
    .fold(1u64, |acc, &x| acc.saturating_mul(x as u64));
    // Activation buffers are allocated for a whole batch but their pages are committed only
    // as rows are used: a decode step touches one row, a prompt batch its length. Counting
    // all `n_batch` rows (512 of an 8B model: 115 MiB) would stream weights every token on
    // a small device to make room for a prompt that may never come; a longer prompt batch
    // costs its extra rows in reclaimed weight pages instead.
    let n_batch = n_batch.min(MARGIN_BATCH_ROWS);
    let floats = n_batch
        * (3 * hp.n_embd
            + 2 * hp.q_dim()
            + 2 * hp.k_dim()
            + hp.v_dim()
            + hp.n_head * hp.head_dim_v
            + 2 * hp.n_ff)
        + hp.n_vocab;
    let quantized = n_batch * hp.n_ff.max(hp.n_embd);
    kv.saturating_add((4 * floats + quantized) as u64 + PROCESS_OVERHEAD)
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

/// The budget of a ring device for the weights of its own windows: `arg` resolved against
/// this device's memory (read now, for `auto`) less the margin of the `held` layers' KV
/// caches (`n_slots` of them) and buffers, and on the head also less the output head (and final norm), which it
/// reads every token outside any window. `None`: no budget, everything stays resident.
pub fn ring_device_budget(
    arg: MemBudget,
    model: &Model,
    held: usize,
    head: bool,
    n_ctx: usize,
    n_batch: usize,
    n_slots: usize,
) -> Option<WeightBudget> {
    let memory = match arg {
        MemBudget::Auto => match crate::profile::device_memory() {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(error = %e, "memory unreadable: no memory budget");
                None
            }
        },
        _ => None,
    };
    let mut margin = memory_margin_for_layers(model.hparams(), held, n_ctx, n_batch, n_slots);
    margin += code_pages(model.gguf().path());
    if head {
        margin += model.read_whole_bytes();
    }
    resolve_budget(arg, memory.as_ref(), margin)
}

/// The pages of files this process maps other than the model: the executable, its
/// plugins and the libraries they load, read every token. They are page cache, which
/// the available memory counts as free, so a budget that filled it with weights left
/// them to be evicted and faulted back each token (measured on the home lab: 61 MiB on
/// a node with a 1000 MB limit, 336 major faults a token). Linux and Android read
/// `/proc/self/smaps`; elsewhere 0.
pub fn code_pages(model: &std::path::Path) -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let model = std::fs::canonicalize(model).unwrap_or_else(|_| model.to_path_buf());
    file_pages_except(&text, &model)
}

/// Σ Rss of the file mappings in `smaps` text other than `except`.
fn file_pages_except(smaps: &str, except: &std::path::Path) -> u64 {
    let mut counted = false;
    let mut kib = 0u64;
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if counted {
                kib += rss
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|a| a.contains('-'))
            && line.as_bytes().first().is_some_and(u8::is_ascii_hexdigit)
        {
            // A mapping's header: `start-end perms offset dev inode [path]`.
            let path = line.split_whitespace().nth(5).unwrap_or("");
            counted = path.starts_with('/') && std::path::Path::new(path) != except;
        }
    }
    kib << 10
}

/// Says on stderr what a ring device's budget made of its windows, when it streams any.
pub fn report_budget(role: &str, budget: Option<&WeightBudget>, residency: &Residency) {
    if let (Some(b), true) = (budget, residency.streams()) {
        eprintln!(
            "{role}: memory: {b}; {} of its windows' weights streamed per token",
            mib(residency.streamed_bytes())
        );
    }
}

pub(crate) fn mib(bytes: u64) -> String {
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

/// Memory a draft model takes on the head: its weights (read every drafted token, so
/// resident) and, as the target's, a KV cache of `n_ctx` positions per slot and its
/// buffers; the target's budget leaves room for it.
pub fn draft_memory(model: &Model, n_ctx: usize, n_batch: usize, n_slots: usize) -> u64 {
    let n_ctx = n_ctx.min(model.hparams().n_ctx_train.max(1));
    let weights: u64 = model.weight_tensors().map(|t| t.n_bytes).sum();
    // One process holds both models: its overhead is in the target's margin already.
    let margin = memory_margin(model.hparams(), n_ctx, n_batch, n_slots) - PROCESS_OVERHEAD;
    weights + margin
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
    fn code_pages_count_every_file_mapping_but_the_model() {
        let smaps = "\
55d0c0000000-55d0c0400000 r-xp 00000000 fd:01 12 /usr/bin/prima
Size:               4096 kB
Rss:                3000 kB
7f0000000000-7f0040000000 r--s 00000000 fd:01 13 /models/m.gguf
Rss:              900000 kB
7f0050000000-7f0050100000 rw-p 00000000 00:00 0
Rss:                1024 kB
7f0060000000-7f0060200000 r-xp 00000000 fd:01 14 /usr/lib/libLLVM.so
Rss:                2000 kB
";
        let bytes = file_pages_except(smaps, std::path::Path::new("/models/m.gguf"));
        assert_eq!(bytes, 5000 << 10);
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
            arch: prima_core::model::Architecture::Llama,
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
            rope_scaling: prima_core::model::RopeScaling::None,
            attention_scale: 0.125,
            sliding_window: 0,
            local_layers: Vec::new(),
            rope_freq_base_local: 10000.0,
            rope_scaling_local: false,
            rope_attn_factor: 1.0,
        };
        let short = memory_margin(&hp, 256, 1, 1);
        let long = memory_margin(&hp, 4096, 1, 1);
        // 22 layers × 3840 positions × 4 heads × 128 dims × 2 bytes.
        assert_eq!(long - short, 22 * 3840 * 4 * 128 * 2);
        assert!(short > PROCESS_OVERHEAD);
        // Batches count up to MARGIN_BATCH_ROWS rows of activations, no more.
        let rows = |n| memory_margin(&hp, 256, n, 1);
        assert!(rows(64) > rows(1));
        assert_eq!(rows(512), rows(64));
        // Each slot has a KV cache of the whole context; the buffers are shared.
        let slots = |n| memory_margin(&hp, 4096, 1, n);
        assert_eq!(slots(4) - slots(1), 3 * 22 * 4096 * 4 * 128 * 2);
        assert_eq!(slots(4) - long, slots(4) - slots(1));
    }
}
