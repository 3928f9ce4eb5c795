//! Prima's wgpu backend plugin: GPUs through Metal (Apple), Vulkan (Linux, Android,
//! Windows) and DX12 (Windows), behind the backend ABI. The crate keeps the design card's
//! name, `backend-metal`; the backend is called `wgpu` (`--backend wgpu`).
//!
//! Built with no GPU SDK: wgpu opens the Vulkan loader at run time, and a machine without
//! an adapter still loads the plugin; it reports why through the ABI's `unavailable` and
//! refuses `create`. Software adapters (llvmpipe) are used only when asked
//! (`PRIMA_WGPU_ALLOW_SOFTWARE=1`, see [`device`]).
//!
//! - [`kernels`]: the WGSL sources, one per operation, format family or row-kernel
//!   template, and how one pipeline's shader is assembled.
//! - [`device`]: the availability probe and an opened adapter (device, queue, pipelines).
//! - [`ops`]: the host side of each operation: checks and recorded dispatches over
//!   device-resident activation buffers; one submission and one wait per download. An
//!   element-wise, norm or RoPE call is held back one call so that the next can take it
//!   into its own dispatch (`ops::fusion`: add + norm + quantize, SwiGLU + quantize, q and
//!   k RoPE), the same arithmetic in the same order.
//! - [`params`]: the per-operation arguments of the recorded commands, a range each.
//! - [`texels`]: Q4_1 and Q8_0 weights repacked as texture rows for CPU adapters.
//! - [`backend`]: opening the backend and the plugin's exports. The ABI glue (every call
//!   guarded against panics; GPU errors are collected in `ops`), the format table, argument
//!   checks and KV-cache bookkeeping are `prima-gpu-support`'s, shared with the CUDA plugin.
//!
//! Numerics: the CUDA plugin's, which are the CPU backend's (its scalar kernels are the
//! oracle). A matmul quantizes its activations once to the weight format's 8-bit companion
//! (Q8_0, Q8_1, Q8_K), takes integer block sums (`dot4I8Packed`) and combines each block
//! with the CPU's scale arithmetic, adding blocks in the CPU's order; norms, attention and
//! activations follow the CPU step for step, f16 conversions are done on integers (round to
//! nearest even), and RoPE's cos/sin come from the host. F32 weights' dot terms are WGSL
//! `fma()`, as the CPU's canonical F32 dot fuses them; WGSL does not promise a fused `fma`,
//! and lavapipe's is not (Mesa lowers it to a multiply and an add), so there F32 matmuls
//! differ from the CPU in the last bits. WGSL gives no control over fused
//! multiply-add contraction or reassociation (SPIR-V from naga marks nothing exact), so two
//! places are written to survive the latter: e^x rounds with `round()` rather than the
//! CPU's add-and-subtract trick, and the row-per-invocation matmul passes each block value
//! through an opaque OR before adding it. f64 (the CPU's RMS and softmax sums, attention's
//! e^x and tanh) is used where the adapter has SHADER_F64, f32 otherwise. On lavapipe every
//! operation, every format but F32's matmul and whole models (SmolLM2 Q4_1, Gemma 3 Q4_K_M)
//! equal the CPU bit for bit (tests/lavapipe.rs); other drivers are untested.
//!
//! Reductions use workgroup memory; subgroup operations are not used (the CPU's summation
//! order, which the kernels keep, is serial where it matters). Matmul comes in two shapes
//! with the same bits: a workgroup per weight row (GPUs) and an invocation per row (CPU
//! adapters, where barriers are costly). On CPU adapters the 32-element formats take a
//! third template shaped for llvmpipe (`matmul_legacy_rows.wgsl`: whole-block word reads,
//! one token per workgroup when decoding, activations from a uniform buffer, which
//! llvmpipe reads once per SIMD vector where a storage buffer is read lane by lane), and
//! Q4_1 and Q8_0 weights there are also kept as textures ([`texels`]: 16-byte fetches).
//! A generated token's row kernel has its block loop unrolled: llvmpipe loads a uniform
//! buffer once for all lanes only at an offset it sees is lane-invariant (a constant, not
//! a loop counter) and only outside control flow. On a CPU adapter a dispatch costs tens
//! of microseconds whatever it does, so fewer dispatches matter as much as faster ones.

pub mod backend;
pub mod bind_groups;
pub mod device;
pub mod kernels;
pub mod ops;
pub mod params;
pub mod texels;

/// The weight formats the GPU reads, shared with the other GPU plugin.
pub use prima_gpu_support::formats;

pub use backend::{create_backend, WgpuBackend};

prima_abi::export_backend_plugin!(
    name = "wgpu",
    create = create_backend,
    unavailable = backend::unavailable,
    gpu_memory = backend::gpu_memory
);
