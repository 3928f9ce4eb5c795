//! Prima's CPU backend plugin.
//!
//! - [`formats`]: each GGUF tensor format's block layout and scalar kernels, gathered in
//!   one dispatch table ([`formats::scalar`]) — the reference for future SIMD kernels.
//! - [`ops`]: the backend operations (matmul, get_rows, norms, RoPE, element-wise,
//!   attention over the KV cache) as plain Rust over slices, validating their inputs.
//! - [`pool`]: the persistent thread pool and reusable scratch buffers.
//! - [`buffers`]: the activation buffers of the ABI (`Buf`), which here are host memory:
//!   operations run on them in place, so the CPU pays no copy beyond the engine's one
//!   upload of a window's input and one download of its output.
//! - [`backend`]: the ABI glue implementing `prima_abi`'s `Backend` trait.

pub mod backend;
pub mod buffers;
pub mod formats;
pub mod ops;
pub mod pool;

pub use backend::{create_backend, CpuBackend};

prima_abi::export_backend_plugin!(name = "cpu", create = create_backend);
