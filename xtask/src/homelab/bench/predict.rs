//! Halda's latency model (`halda::Lda::predict`, the figure every plan is scored with)
//! evaluated for a plan Halda did not choose — a pinned plan at another k — or with the
//! bed's links, which live profiles do not measure. Labelled as the model's figure in
//! every table; nothing here is a measurement, and nothing here runs anything.

use prima_cluster::halda::{Lda, MemoryModels, ModelProfile, NoMemoryModel, PlanOptions};
use prima_cluster::profile::{DeviceProfile, LinkProfile};

/// Halda's own figure for `windows` (w_m per device, ring order, CPU only) on devices
/// with these `profiles` (same order), with `n_kv` tokens of KV cache as `prima apply`
/// plans (its `ctx`): the devices with a window only, as Halda scores its plans — when
/// it leaves the head without layers, the next device stands in for it (its output
/// layer, no hop back).
pub fn halda_tpot_ms(
    model: &ModelProfile,
    profiles: &[DeviceProfile],
    windows: &[usize],
    n_kv: usize,
    os: &dyn MemoryModels,
) -> Result<f64, NoMemoryModel> {
    let active: Vec<usize> = (0..windows.len()).filter(|&m| windows[m] > 0).collect();
    let chosen: Vec<DeviceProfile> = active.iter().map(|&m| profiles[m].clone()).collect();
    score(model, &chosen, &active, windows, n_kv, os)
}

/// The bed's links, per device in ring order: one-way latency and upload rate.
pub struct Links<'a> {
    pub latency_ms: &'a [f64],
    pub link_mbit: &'a [Option<f64>],
}

/// Halda's model for the ring as `prima apply` runs `windows`: the head always (input,
/// output layer, and the hops to and from it, even without layers), the other devices
/// with a window. With `links`, each hop from a device to the next in that ring waits
/// for both devices' one-way latencies (the link router holds each packet for their
/// sum) and goes at the sender's upload rate; a head alone has no hop.
pub fn ring_tpot_ms(
    model: &ModelProfile,
    profiles: &[DeviceProfile],
    windows: &[usize],
    n_kv: usize,
    links: Option<&Links<'_>>,
    os: &dyn MemoryModels,
) -> Result<f64, NoMemoryModel> {
    let ring: Vec<usize> = (0..windows.len())
        .filter(|&m| m == 0 || windows[m] > 0)
        .collect();
    let chosen: Vec<DeviceProfile> = ring
        .iter()
        .enumerate()
        .map(|(j, &m)| {
            let mut p = profiles[m].clone();
            if let Some(links) = links {
                let next = ring[(j + 1) % ring.len()];
                p.link = (ring.len() > 1).then(|| LinkProfile {
                    rtt_ms: 2.0 * (links.latency_ms[m] + links.latency_ms[next]),
                    // No cap: as fast as the machine's veth and router go (~10 Gbit/s).
                    bytes_per_s: links.link_mbit[m].map_or(1.25e9, |mbit| mbit * 1e6 / 8.0),
                });
            }
            p
        })
        .collect();
    score(model, &chosen, &ring, windows, n_kv, os)
}

/// `Lda::predict` for the devices `chosen` (the profiles of `at`), their windows.
fn score(
    model: &ModelProfile,
    chosen: &[DeviceProfile],
    at: &[usize],
    windows: &[usize],
    n_kv: usize,
    os: &dyn MemoryModels,
) -> Result<f64, NoMemoryModel> {
    let refs: Vec<&DeviceProfile> = chosen.iter().collect();
    let w: Vec<u32> = at.iter().map(|&m| windows[m] as u32).collect();
    let opts = PlanOptions {
        n_kv: n_kv as f64,
        ..PlanOptions::default()
    };
    let lda = Lda::new(model, &refs, &[], os, &opts)?;
    Ok(lda.predict(&w, &vec![0; w.len()]).total_s * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prima_cluster::halda::{plan, Scheduler};
    use prima_cluster::profile::{DeviceProfiles, GpuKind};
    use prima_core::plugin::{load_os_models_from, LoadedOsModels};

    /// The OS memory plugin, from beside this test binary (a workspace build puts it there).
    fn os() -> LoadedOsModels {
        let exe = std::env::current_exe().unwrap();
        load_os_models_from(&[exe.ancestors().nth(2).unwrap().to_path_buf()])
    }

    /// The paper's 8B as a sparse file (in a directory of the test's own: tests run in
    /// parallel) and the homogeneous bed's profiles without their GPUs.
    fn fixtures(test: &str) -> (ModelProfile, Vec<DeviceProfile>) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = std::env::temp_dir().join(format!("prima-xtask-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = prima_cluster::halda::synth::spec("llama3-8b-q4_k").expect("the 8B spec");
        let path = spec.write_to(&dir).unwrap();
        let model = ModelProfile::open(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let profiles =
            DeviceProfiles::load(&root.join("manifests/testbeds/homogeneous-4.toml")).unwrap();
        // The home lab's devices have no GPU.
        let cpu_only = profiles
            .device
            .into_iter()
            .map(|mut p| {
                p.gpu = GpuKind::None;
                p
            })
            .collect();
        (model, cpu_only)
    }

    #[test]
    fn the_model_scores_a_plan_as_the_planner_does() {
        let (model, profiles) = fixtures("scores");
        // MemSched's plan, scored by the planner itself and by halda_tpot_ms: the same.
        let planned = plan(
            &model,
            &profiles,
            Scheduler::Mem,
            None,
            &os(),
            &PlanOptions {
                n_kv: 1024.0,
                ..PlanOptions::default()
            },
        )
        .unwrap();
        let w: Vec<usize> = planned.devices.iter().map(|d| d.w as usize).collect();
        assert!(planned.devices.iter().all(|d| d.n == 0));
        let ours = halda_tpot_ms(&model, &profiles, &w, 1024, &os()).unwrap();
        assert!(
            (ours - planned.predicted_tpot_ms).abs() < 1e-6 * ours,
            "{ours} vs {}",
            planned.predicted_tpot_ms
        );
        // With every device in the ring and the profiles' own links, the ring's figure is
        // Halda's.
        assert_eq!(
            ring_tpot_ms(&model, &profiles, &w, 1024, None, &os()).unwrap(),
            ours
        );
        // More rounds never help in this model (each costs the devices' ξ once more).
        let k1 = halda_tpot_ms(&model, &profiles, &[8, 8, 8, 8], 1024, &os()).unwrap();
        let k4 = halda_tpot_ms(&model, &profiles, &[2, 2, 2, 2], 1024, &os()).unwrap();
        assert!(k4 >= k1, "{k4} < {k1}");
    }

    #[test]
    fn the_ring_keeps_its_head_and_pays_its_links() {
        let (model, profiles) = fixtures("links");
        let none: Vec<DeviceProfile> = profiles
            .into_iter()
            .map(|mut p| {
                p.link = None;
                p
            })
            .collect();
        let latency = [5.0; 4];
        let mbit = [Some(300.0); 4];
        let links = Links {
            latency_ms: &latency,
            link_mbit: &mbit,
        };
        let w = [8, 8, 8, 8];
        let base = ring_tpot_ms(&model, &none, &w, 1024, None, &os()).unwrap();
        let with = ring_tpot_ms(&model, &none, &w, 1024, Some(&links), &os()).unwrap();
        // Four hops of 10 ms one way, plus 16 KiB of hidden state at 300 Mbit/s each.
        assert!((40.0..42.0).contains(&(with - base)), "{base} → {with}");
        // At k = 2 every hop is paid twice.
        let k2 = ring_tpot_ms(&model, &none, &[4; 4], 1024, Some(&links), &os()).unwrap()
            - ring_tpot_ms(&model, &none, &[4; 4], 1024, None, &os()).unwrap();
        assert!((80.0..84.0).contains(&k2), "{k2}");
        // A head without layers stays in the ring: two hops (to the device and back);
        // Halda's own score leaves it out, so neither hop nor its output layer is there.
        let one = [0, 32, 0, 0];
        let hops = ring_tpot_ms(&model, &none, &one, 1024, Some(&links), &os()).unwrap()
            - ring_tpot_ms(&model, &none, &one, 1024, None, &os()).unwrap();
        assert!((20.0..21.0).contains(&hops), "{hops}");
        // The head alone: no hop at all.
        let alone = [32, 0, 0, 0];
        assert_eq!(
            ring_tpot_ms(&model, &none, &alone, 1024, Some(&links), &os()).unwrap(),
            ring_tpot_ms(&model, &none, &alone, 1024, None, &os()).unwrap()
        );
        assert_eq!(
            halda_tpot_ms(&model, &none, &alone, 1024, &os()).unwrap(),
            ring_tpot_ms(&model, &none, &alone, 1024, None, &os()).unwrap()
        );
    }
}
