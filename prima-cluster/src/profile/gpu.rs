//! The GPU side of a device's profile, measured through its GPU backend plugin: s_m^{gpu,q}
//! (matmul throughput per weight class, with the plugin's own kernels), 𝒯_m^{gpu} (the
//! rate its matmul reads weights from VRAM), t_m^{ram-vram} (one hidden state across the
//! bus) and the memory the plugin reports (VRAM; on unified memory, RAM's share).

use std::time::{Duration, Instant};

use abi_stable::std_types::{RSlice, RSliceMut};

use super::probe_bufs::ProbeBufs;
use serde::{Deserialize, Serialize};

use super::compute::cpu_throughput;
use super::device::{QuantRates, GB};
use prima_abi::backend::{BackendBox, GpuMemory, TensorView};
use prima_core::gguf::GgmlType;

/// A GPU backend to profile beside the CPU one.
#[derive(Clone, Copy)]
pub struct GpuProbe<'a> {
    pub backend: &'a BackendBox,
    /// The plugin's name (part of the profile cache's key).
    pub name: &'a str,
    /// What the plugin reports now (read fresh, never cached).
    pub memory: GpuMemory,
}

/// What was measured on the GPU: cached with the CPU's figures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuMeasured {
    /// s_m^{gpu,q}.
    pub gflops: QuantRates,
    /// 𝒯_m^{gpu} in bytes/s.
    pub read_bytes_per_s: f64,
    /// t_m^{ram-vram} in ms.
    pub copy_ms: f64,
}

/// Columns of the read-rate probe's matrix; its rows make [`READ_BYTES`].
const READ_COLS: usize = 4096;
/// Bytes of the read-rate probe's weights: far beyond any GPU's caches.
const READ_BYTES: usize = 128 << 20;

/// Measures the GPU through `backend` in about a second.
pub fn measure_gpu(backend: &BackendBox, hidden: usize) -> Result<GpuMeasured, String> {
    let gflops = cpu_throughput(backend, Duration::from_millis(60))?;
    let read_bytes_per_s = read_rate(backend, Duration::from_millis(300))?;
    let copy_ms = copy_ms(backend, hidden, Duration::from_millis(50))?;
    Ok(GpuMeasured {
        gflops,
        read_bytes_per_s,
        copy_ms,
    })
}

/// 𝒯^{gpu}: bytes per second a one-token matmul reads from a weight matrix too large for
/// any cache, the fastest of several calls after a first that uploads it (a GPU backend
/// keeps weights resident in its memory, in their stored blocks).
fn read_rate(backend: &BackendBox, budget: Duration) -> Result<f64, String> {
    let t = GgmlType::Q8_0;
    let row_bytes = t.row_bytes(READ_COLS).ok_or("Q8_0 rows of 4096 columns")?;
    let rows = READ_BYTES / row_bytes;
    let data = vec![0u8; rows * row_bytes];
    let bufs = ProbeBufs::new(backend, &vec![0.5f32; READ_COLS], rows)?;
    let mut out = vec![0f32; rows];
    let view = TensorView {
        data: RSlice::from_slice(&data),
        ggml_type: t.id(),
        cols: READ_COLS as u64,
        rows: rows as u64,
    };
    let mut run = || -> Result<f64, String> {
        let start = Instant::now();
        // The download waits for the product: the time is the device's.
        backend
            .matmul(view, bufs.x, 1, bufs.out)
            .and_then(|()| backend.download(bufs.out, RSliceMut::from_mut_slice(&mut out)))
            .into_result()
            .map_err(|e| format!("matmul Q8_0 ({} MiB): {e}", data.len() >> 20))?;
        Ok(start.elapsed().as_secs_f64())
    };
    run()?;
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut calls = 0;
    while start.elapsed() < budget || calls < 2 {
        best = best.min(run()?);
        calls += 1;
    }
    Ok(data.len() as f64 / best.max(1e-9))
}

/// t^{ram-vram}: half the time of one hidden state's (`hidden` floats) upload and
/// download, the two copies a window of GPU layers makes.
fn copy_ms(backend: &BackendBox, hidden: usize, budget: Duration) -> Result<f64, String> {
    let mut x = vec![1.0f32; hidden.max(1)];
    let bufs = ProbeBufs::new(backend, &x, 0)?;
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < budget || calls < 3 {
        let t = Instant::now();
        backend
            .upload(bufs.x, RSlice::from_slice(&x))
            .and_then(|()| backend.download(bufs.x, RSliceMut::from_mut_slice(&mut x)))
            .into_result()
            .map_err(|e| format!("upload and download: {e}"))?;
        best = best.min(t.elapsed().as_secs_f64());
        calls += 1;
    }
    Ok(best * 1e3 / 2.0)
}

impl GpuMeasured {
    /// 𝒯^{gpu} in GB/s, as profiles keep it.
    pub fn read_gb_s(&self) -> f64 {
        self.read_bytes_per_s / GB
    }
}
