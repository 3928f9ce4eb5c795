//! Prima's CPU backend plugin.
//!
//! - [`formats`]: each GGUF tensor format's block layout and scalar kernels, gathered in
//!   one dispatch table ([`formats::scalar`]) — the reference for future SIMD kernels.
//! - [`ops`]: the backend operations (matmul, get_rows, norms, RoPE, element-wise,
//!   attention over the KV cache) as plain Rust over slices, validating their inputs.
//! - [`pool`]: the persistent thread pool and reusable scratch buffers.
//! - [`backend`]: the ABI glue implementing `prima_abi`'s `Backend` trait.

pub mod backend;
pub mod formats;
pub mod ops;
pub mod pool;

pub use backend::{create_backend, CpuBackend};

prima_abi::export_backend_plugin!(name = "cpu", create = create_backend);
