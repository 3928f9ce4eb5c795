//! The backend's compute resources: one persistent thread pool, and scratch buffers reused
//! across calls so the per-token path does not allocate once they have grown.

use rayon::{ThreadPool, ThreadPoolBuilder};

/// Builds the pool once per backend: `threads` workers, or one per available core for 0.
pub fn build_pool(threads: u32) -> Result<ThreadPool, String> {
    let n = match threads {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n as usize,
    };
    ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("prima-cpu-{i}"))
        .build()
        .map_err(|e| format!("cpu backend: cannot start {n} compute threads: {e}"))
}

/// Buffers the ops borrow for the length of one call. They only ever grow.
#[derive(Default)]
pub struct Scratch {
    /// Activations converted to the weight type's vec_dot type (matmul).
    pub activations: Vec<u8>,
    /// Matmul results in weight-row-major order, before transposing to token-major.
    pub rows_by_token: Vec<f32>,
    /// Queries rounded to f16 (attention).
    pub queries: Vec<f32>,
    /// cos/sin pairs of one position (rope).
    pub rope: Vec<f32>,
}

/// Resizes `buf` to `len` without shrinking its capacity.
pub fn sized<T: Default + Clone>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}
