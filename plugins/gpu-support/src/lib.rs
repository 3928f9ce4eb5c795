//! What Prima's GPU backend plugins (`backend-cuda`, `backend-metal`) share, so that each
//! holds only its device code: kernels, uploads, launches.
//!
//! - [`backend`]: the ABI glue. [`backend::GpuBackend`] implements the plugin `Backend`
//!   trait over a plugin's [`backend::GpuOps`] state behind a lock, turning errors — and
//!   panics, which must never cross the FFI boundary — into `RString`s.
//! - [`formats`]: the weight formats a GPU reads (all the CPU backend multiplies), the
//!   activation kind each multiplies against, and the checks a weight passes before upload.
//! - [`bufs`]: activation-buffer bookkeeping (ids, lengths, range checks) over the
//!   plugin's device buffers.
//! - [`checks`]: the argument checks every operation shares with the CPU backend.
//! - [`kv`]: KV-cache bookkeeping (handles, positions held per layer) over the plugin's
//!   buffers.
//! - [`conformance`] (feature `conformance`, tests only): the suite every GPU plugin passes
//!   against the CPU backend, the oracle — each format, each operation, whole models.

pub mod backend;
pub mod bufs;
pub mod checks;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod formats;
pub mod kv;

pub use checks::OpResult;
