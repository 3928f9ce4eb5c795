use std::path::PathBuf;

use crate::gguf::GgufError;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArchitecture {
        path: PathBuf,
        arch: String,
        supported: String,
    },
    #[error("{path}: tensor '{tensor}' has type {ty}, which the {backend} backend cannot compute")]
    UnsupportedTensorType {
        path: PathBuf,
        tensor: String,
        ty: String,
        backend: String,
    },
    #[error("{path}: tensor '{tensor}' holds {found} experts, but {key} = {expected}")]
    ExpertCount {
        path: PathBuf,
        tensor: String,
        found: u64,
        key: String,
        expected: usize,
    },
    #[error("{path}: invalid hyper-parameter: {what}")]
    BadHyperParameter { path: PathBuf, what: String },
    #[error("backend operation {op} failed: {message}")]
    Backend { op: &'static str, message: String },
    #[error("context full: {needed} positions needed, the context holds {n_ctx}")]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("layer {layer} is not held by this session (it holds {held})")]
    LayerNotHeld { layer: usize, held: String },
    #[error("batch of {n} tokens does not fit the session's batch size {n_batch}")]
    BatchTooLarge { n: usize, n_batch: usize },
    #[error("batch starts at position {start}, but only {n_past} positions are cached")]
    PositionGap { start: usize, n_past: usize },
    #[error("logits of rows {rows} asked, but the last batch has {batch} rows (at most {n_batch} at once)")]
    RowsOutOfBatch {
        rows: String,
        batch: usize,
        n_batch: usize,
    },
    #[error("an output of {len} floats given for {needed} logits")]
    OutputSize { len: usize, needed: usize },
    #[error("a session needs at least one slot")]
    NoSlots,
    #[error("slot {slot} does not exist (the session holds {n_slots} slots: 0..{n_slots})")]
    UnknownSlot { slot: usize, n_slots: usize },
    #[error("slot {slot} appears twice in one batch")]
    SlotTwice { slot: usize },
    #[error("the entry of slot {slot} holds no tokens")]
    EmptyEntry { slot: usize },
    #[error("slot {slot}: context full: {needed} positions needed, each slot holds {n_ctx}")]
    SlotContextFull {
        slot: usize,
        needed: usize,
        n_ctx: usize,
    },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("slot {slot}: the logits of its last {rows} tokens asked, but its entry holds {tokens} (1 to {tokens})")]
    EntryRows {
        slot: usize,
        rows: usize,
        tokens: usize,
    },
    #[error("logits rows given for {given} entries, but the batch has {entries}")]
    EntryRowsCount { given: usize, entries: usize },
}
