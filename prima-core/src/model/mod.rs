//! Transformer models over a compute backend: hyper-parameters and weights from GGUF,
//! one small file per architecture, and the forward pass shared by all of them.
//!
//! The forward pass is written only in terms of [`Backend`](prima_abi::backend::Backend)
//! operations; it holds weights as views into the GGUF mapping and never copies them.

mod arch;
mod backend_call;
mod batch_plan;
mod error;
mod ffn;
mod forward;
mod hparams;
mod scratch;
mod weights;

pub use arch::Architecture;
pub use batch_plan::{check_entries, check_rows, plan_batches, Piece, SeqSpan, SeqTokens};
pub use error::ModelError;
pub use ffn::{DenseFfn, FeedForward};
pub use ffn::{ExpertBiases, ExpertPolicy, ExpertUse, MoeFfn, Routing};
pub use forward::{GpuLayers, Session};
pub use hparams::{ExpertParams, HyperParams, RopeScaling};
pub use weights::{AttentionSinks, LayerWeights, Model};
