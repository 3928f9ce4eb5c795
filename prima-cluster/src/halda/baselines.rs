//! The paper's heuristic baselines, scored with the same latency model as Halda.
//!
//! - **MemSched** (exo, and prima.cpp without Halda): layers in proportion to each
//!   device's memory (available RAM plus VRAM), GPU filled first.
//! - **PerfSched** (Galaxy): layers in proportion to compute, then layers moved off
//!   devices that would run out of memory onto devices with room; if memory still runs
//!   out, the overflow is offloaded to CPUs in proportion to CPU speed.
//!
//! Both use one window per device (k = 1) and every device.

use super::lda::Lda;
use crate::profile::GIB;

/// A baseline's placement.
#[derive(Debug, Clone)]
pub struct Placement {
    pub w: Vec<u32>,
    pub n: Vec<u32>,
}

/// Splits `total` integer units in proportion to `weights`, at least one each, by largest
/// remainder.
pub fn proportional(total: u32, weights: &[f64]) -> Vec<u32> {
    let m = weights.len() as u32;
    assert!(m > 0 && total >= m, "{total} layers over {m} devices");
    let spare = (total - m) as f64;
    let sum: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    let shares: Vec<f64> = weights
        .iter()
        .map(|w| {
            if sum > 0.0 {
                spare * w.max(0.0) / sum
            } else {
                spare / m as f64
            }
        })
        .collect();
    let mut out: Vec<u32> = shares.iter().map(|s| 1 + s.floor() as u32).collect();
    let mut left = total - out.iter().sum::<u32>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let fa = shares[a] - shares[a].floor();
        let fb = shares[b] - shares[b].floor();
        fb.total_cmp(&fa)
    });
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// GPU layers: as many of a device's layers as its GPU holds (k = 1).
fn fill_gpus(lda: &Lda, w: &[u32]) -> Vec<u32> {
    w.iter()
        .enumerate()
        .map(|(m, &wm)| wm.min(lda.gpu_cap_layers(m)))
        .collect()
}

/// MemSched: w ∝ available RAM + VRAM.
pub fn mem_sched(lda: &Lda, ram_plus_vram_gib: &[f64]) -> Placement {
    let w = proportional(lda.n_layers, ram_plus_vram_gib);
    let n = fill_gpus(lda, &w);
    Placement { w, n }
}

/// PerfSched: w ∝ compute speed, then out-of-memory layers migrated, then CPU offload.
pub fn perf_sched(lda: &Lda) -> Placement {
    let l = lda.n_layers;
    // Compute power: layers per second on the device's fastest processor.
    let speed: Vec<f64> = lda
        .devices
        .iter()
        .map(|d| {
            let cpu = d.cpu_layer_s;
            let t = if d.has_gpu {
                d.gpu_layer_s.min(cpu)
            } else {
                cpu
            };
            1.0 / t.max(1e-12)
        })
        .collect();
    let mut w = proportional(l, &speed);
    // Capacity in layers without paging: GPU layers plus what RAM holds beyond buffers.
    let capacity: Vec<u32> = (0..lda.len())
        .map(|m| {
            let d = &lda.devices[m];
            let ram = ((d.budget - d.mem.b_cio()) / lda.b_prime).floor().max(0.0) as u32;
            lda.gpu_cap_layers(m) + ram
        })
        .collect();
    // Migrate the overflow of out-of-memory devices to the fastest devices with room.
    let mut overflow = 0u32;
    for m in 0..w.len() {
        if w[m] > capacity[m].max(1) {
            overflow += w[m] - capacity[m].max(1);
            w[m] = capacity[m].max(1);
        }
    }
    let mut by_speed: Vec<usize> = (0..w.len()).collect();
    by_speed.sort_by(|&a, &b| speed[b].total_cmp(&speed[a]));
    for &m in &by_speed {
        if overflow == 0 {
            break;
        }
        let room = capacity[m].saturating_sub(w[m]);
        let moved = room.min(overflow);
        w[m] += moved;
        overflow -= moved;
    }
    // Still out of memory: offload the rest to CPUs in proportion to CPU speed.
    if overflow > 0 {
        let cpu_speed: Vec<f64> = lda.devices.iter().map(|d| 1.0 / d.cpu_layer_s).collect();
        let sum: f64 = cpu_speed.iter().sum();
        let mut given = 0u32;
        let shares: Vec<u32> = cpu_speed
            .iter()
            .map(|s| (overflow as f64 * s / sum).floor() as u32)
            .collect();
        for (m, s) in shares.iter().enumerate() {
            w[m] += s;
            given += s;
        }
        w[by_speed[0]] += overflow - given;
    }
    let n = fill_gpus(lda, &w);
    Placement { w, n }
}

/// Available RAM plus VRAM of each device in GiB (MemSched's weights). On unified memory
/// the Metal working set is part of RAM, so it counts once.
pub fn memory_weights(devices: &[&crate::profile::DeviceProfile]) -> Vec<f64> {
    devices
        .iter()
        .map(|d| match d.gpu {
            crate::profile::GpuKind::Cuda => d.ram_available_gib + d.gpu_available_gib,
            crate::profile::GpuKind::Metal => d.ram_available_gib.max(d.gpu_available_gib),
            crate::profile::GpuKind::None => d.ram_available_gib,
        })
        .map(|g| g * GIB)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::proportional;

    #[test]
    fn proportional_split_sums_and_gives_each_one() {
        let w = proportional(32, &[8.0, 8.0, 11.0, 0.0]);
        assert_eq!(w.iter().sum::<u32>(), 32);
        assert!(w.iter().all(|&x| x >= 1));
        assert!(w[2] > w[0] && w[0] >= w[3]);
        assert_eq!(proportional(4, &[1.0, 1.0, 1.0, 1.0]), vec![1, 1, 1, 1]);
    }
}
