//! GGUF files: the metadata, the tensor index, and tensor data as slices of the mapping.

mod ggml_type;

pub use ggml_type::{GgmlType, QK_K};
