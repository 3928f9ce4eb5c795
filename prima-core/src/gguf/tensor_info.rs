//! One entry of a GGUF file's tensor index: name, shape, element type and where its
//! bytes are. Plain data, below both the parser that builds it and the reader that serves it.

use super::GgmlType;

/// One entry of the tensor index, with its offset already resolved to the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// `dims[0]` (`ne[0]` in ggml) is the contiguous row length.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute offset of the first byte of data in the file.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// The row length, `dims[0]` (1 for a scalar).
    pub fn cols(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// The number of rows: the product of `dims[1..]`, 1 if there are none.
    pub fn rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}
