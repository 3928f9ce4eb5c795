//! Prima's CUDA backend plugin: NVIDIA GPUs behind the backend ABI.
//!
//! Built with no CUDA toolkit or driver: the driver API and NVRTC are opened at run time
//! (cudarc, dynamic loading), and the kernels are CUDA C compiled by NVRTC for the GPU
//! found, cached on disk. Where there is no driver, NVRTC or device the plugin still
//! loads; it reports why through the ABI's `unavailable` and refuses `create`.
//!
//! - [`kernels`]: the CUDA C sources, one per operation or format family (`*.cu`), and how
//!   a compilation unit is assembled. No GPU code runs from Rust but through these.
//! - [`compile`]: NVRTC and the on-disk PTX cache.
//! - [`device`]: the availability probe and an opened GPU (context, stream, modules).
//! - [`ops`]: the host side of each operation: checks and stream-ordered launches over
//!   device-resident activation buffers; one wait per download.
//! - [`backend`]: opening the backend and the plugin's exports. The ABI glue (every call
//!   guarded against panics), the format table, argument checks and KV-cache bookkeeping
//!   are `prima-gpu-support`'s, shared with the wgpu plugin.
//!
//! Numerics: the CPU backend's (its scalar kernels are the oracle). A matmul quantizes its
//! activations once to the weight format's 8-bit companion (Q8_0, Q8_1, Q8_K) and takes
//! integer block sums (dp4a) with the CPU's scale arithmetic, summed in the CPU's order;
//! attention, norms and activations follow the CPU step for step and RoPE's cos/sin come
//! from the host, so results agree bit for bit (see tests/gpu.rs).
//!
//! Status: the device-buffer ABI (v5) on one GPU. Activations live in VRAM buffers and
//! every operation is queued on one stream; the host waits once per `download`. Weights
//! live in VRAM in their stored blocks, the KV cache is F16 in VRAM. `gather_rows`,
//! `scatter_scaled`, `sum_groups` and `swiglu_oai` go through the host (the ABI's
//! defaults, counted): only mixtures of experts use them.

pub mod backend;
pub mod compile;
pub mod device;
pub mod kernels;
pub mod ops;

/// The weight formats the GPU reads, shared with the other GPU plugin.
pub use prima_gpu_support::formats;

pub use backend::{create_backend, CudaBackend};

prima_abi::export_backend_plugin!(
    name = "cuda",
    create = create_backend,
    unavailable = backend::unavailable,
    gpu_memory = backend::gpu_memory
);
