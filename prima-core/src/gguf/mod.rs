//! GGUF files: the metadata, the tensor index, and tensor data as slices of the mapping.
//!
//! [`GgufFile`] maps a file read-only and validates all of it at open, so its
//! accessors never fail on bad bytes; [`GgufWriter`] builds files for tests and tools.
//! What the keys and tensors mean to a model is the model layer's business.

mod cursor;
mod error;
mod pages;
mod parse;
mod read_ahead;
mod reader;
mod tensor_info;
mod value;
mod writer;

#[cfg(test)]
mod tests;

pub use error::GgufError;
pub use pages::PageHint;
pub use prima_abi::{GgmlType, QK_K};
pub use read_ahead::ReadAhead;
pub use reader::GgufFile;
pub use tensor_info::TensorInfo;
pub use value::Value;
pub use writer::GgufWriter;
