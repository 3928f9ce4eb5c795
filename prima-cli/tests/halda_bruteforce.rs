//! On small instances (2–4 devices, L ≤ 16) an exhaustive search over every (w, n) with
//! W | L finds the true optimum of the LDA objective; Halda (set iteration over per-k ILPs
//! solved by the HiGHS plugin) must reach it.

mod halda_support;

use halda_support::{os_models, solver};
use prima_cluster::halda::iteration;
use prima_cluster::halda::{Lda, LdaSet, ModelProfile, PlanOptions};
use prima_cluster::profile::{DeviceProfile, GpuKind, LinkProfile, Os, QuantRates};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MIB: f64 = 1024.0 * 1024.0;

/// A small model whose layers are large relative to the devices' memory, so that
/// placements range from all-resident to heavily overloaded.
fn small_model(n_layers: u32) -> ModelProfile {
    let layer_bytes = 200.0 * MIB;
    ModelProfile {
        name: format!("small-{n_layers}"),
        arch: "llama".into(),
        n_layers,
        n_embd: 2048,
        n_vocab: 32000,
        n_head: 16,
        n_ff: 8192,
        layer_flops: [0.8e9, 0.0, 0.2e9, 0.0, 0.0, 1e6],
        attn_flops_per_ctx: 2.0 * 16.0 * 256.0,
        output_flops: [0.0, 0.0, 2.0 * 2048.0 * 32000.0, 0.0, 0.0, 1e4],
        layer_bytes,
        input_bytes: 36.0 * MIB,
        output_bytes: 50.0 * MIB,
        kv_bytes_per_token: 2.0 * (4.0 * 128.0 * 2.0),
        c_cpu: 20.0 * MIB,
        c_gpu: 10.0 * MIB,
        total_bytes: layer_bytes * n_layers as f64 + 86.0 * MIB,
        moe: None,
    }
}

fn random_device(rng: &mut ChaCha8Rng, i: usize, model_bytes: f64) -> DeviceProfile {
    let gib = 1024.0 * MIB;
    let (os, gpu) = match rng.gen_range(0..5) {
        0 => (Os::Linux, GpuKind::None),
        1 => (Os::Linux, GpuKind::Cuda),
        2 => (Os::Macos, GpuKind::None),
        3 => (Os::Macos, GpuKind::Metal),
        _ => (Os::Android, GpuKind::None),
    };
    let cpu = rng.gen_range(20.0..400.0);
    // Memory from a sliver to more than the whole model.
    let ram_avail = rng.gen_range(0.05..1.2) * model_bytes / gib;
    let has_gpu = gpu != GpuKind::None;
    DeviceProfile {
        name: format!("d{i}"),
        os,
        gpu,
        cpu_cores: 8,
        cpu_gflops: QuantRates::uniform(cpu),
        cpu_quota_share: None,
        gpu_gflops: has_gpu.then(|| QuantRates::uniform(cpu * rng.gen_range(2.0..30.0))),
        cpu_read_gb_s: rng.gen_range(10.0..60.0),
        gpu_read_gb_s: has_gpu.then(|| rng.gen_range(60.0..600.0)),
        memcpy_gb_s: 10.0,
        gpu_memcpy_gb_s: None,
        gpu_copy_ms: if gpu == GpuKind::Cuda { 0.05 } else { 0.0 },
        ram_total_gib: ram_avail * 2.0,
        ram_available_gib: ram_avail,
        swap_total_gib: 1.0,
        swap_available_gib: 0.5,
        swappable_gib: if os == Os::Android { 0.2 } else { 0.0 },
        gpu_available_gib: if has_gpu {
            rng.gen_range(0.1..0.8) * model_bytes / gib
        } else {
            0.0
        },
        // Some disks below the slow-disk threshold (0.2 GB/s).
        disk_seq_gb_s: rng.gen_range(0.1..3.5),
        disk_rand_gb_s: rng.gen_range(0.1..1.5),
        link: Some(LinkProfile {
            rtt_ms: rng.gen_range(0.1..10.0),
            bytes_per_s: 5e7,
        }),
        relay: false,
    }
}

/// Every composition of `total` into `parts` positive integers.
fn compositions(total: u32, parts: usize, out: &mut Vec<Vec<u32>>, prefix: &mut Vec<u32>) {
    if parts == 1 {
        prefix.push(total);
        out.push(prefix.clone());
        prefix.pop();
        return;
    }
    for first in 1..=total - (parts as u32 - 1) {
        prefix.push(first);
        compositions(total - first, parts - 1, out, prefix);
        prefix.pop();
    }
}

/// The optimum of the LDA problem by enumeration: every k, every w with eᵀw = W, every
/// n with n_m ≤ min(w_m, GPU capacity); a device with a slow disk must not overload
/// (the paper's Case 4 constraint). Sets follow from (w, n) themselves.
fn brute_force(lda: &Lda, region: Option<&[LdaSet]>) -> Option<(f64, Vec<u32>, Vec<u32>, u32)> {
    let mut best: Option<(f64, Vec<u32>, Vec<u32>, u32)> = None;
    for k in lda.valid_ks() {
        let big_w = lda.n_layers / k;
        let mut ws = Vec::new();
        compositions(big_w, lda.len(), &mut ws, &mut Vec::new());
        // The head may run no layer (it still embeds and runs the output head).
        if lda.len() > 1 {
            compositions(big_w, lda.len() - 1, &mut ws, &mut vec![0]);
        }
        for w in ws {
            let caps: Vec<u32> = (0..lda.len())
                .map(|m| lda.gpu_cap(m, k).min(w[m]))
                .collect();
            let mut n = vec![0u32; lda.len()];
            loop {
                let feasible = (0..lda.len()).all(|m| {
                    let d = &lda.devices[m];
                    !d.slow_disk || {
                        let f = d.behaviour.ram_form(&d.mem);
                        f.w * w[m] as f64 + f.n * n[m] as f64 <= lda.ram_bound(m, k as f64)
                    }
                });
                let in_region = region.is_none_or(|sets| {
                    let wf: Vec<f64> = w.iter().map(|&v| v as f64).collect();
                    let nf: Vec<f64> = n.iter().map(|&v| v as f64).collect();
                    lda.assign_sets(&wf, &nf, &vec![false; lda.len()]) == sets
                });
                if feasible && in_region {
                    let t = lda.predict_paper(&w, &n).total_s;
                    if best.as_ref().is_none_or(|b| t < b.0) {
                        best = Some((t, w.clone(), n.clone(), k));
                    }
                }
                // Next n in the mixed-radix count.
                let mut m = 0;
                while m < n.len() {
                    if n[m] < caps[m] {
                        n[m] += 1;
                        break;
                    }
                    n[m] = 0;
                    m += 1;
                }
                if m == n.len() {
                    break;
                }
            }
        }
    }
    best
}

#[test]
fn halda_reaches_the_exhaustive_optimum_on_small_instances() {
    let s = solver();
    let os = os_models();
    let paper = PlanOptions {
        n_kv: 512.0,
        ..PlanOptions::default()
    };
    let exact = PlanOptions {
        exact: true,
        ..paper
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x4a1da);
    let mut checked = 0;
    let mut set_misses = Vec::new();
    for case in 0..120 {
        let n_layers = [8u32, 12, 16][case % 3];
        let m_count = 2 + case % 3;
        let model = small_model(n_layers);
        let devs: Vec<DeviceProfile> = (0..m_count)
            .map(|i| random_device(&mut rng, i, model.total_bytes))
            .collect();
        let refs: Vec<&DeviceProfile> = devs.iter().collect();
        let lda = Lda::new(&model, &refs, &[], &os, &paper).unwrap();
        let lookup = lda.devices[0].lookup_bytes / lda.devices[0].s_disk;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + lookup + 1e-12;
        let global = brute_force(&lda, None);

        // The exact program reaches the global optimum.
        let ex = iteration::solve_exact(&lda, &s, &exact);
        match (&global, &ex) {
            (None, Err(_)) => continue,
            (None, Ok(h)) => panic!("case {case}: {h:?} where nothing is feasible"),
            (Some(b), Err(e)) => panic!("case {case}: exact failed ({e}) but {b:?} is feasible"),
            (Some(b), Ok(h)) => {
                let t = lda.predict_paper(&h.w, &h.n).total_s;
                assert!(
                    close(t, h.objective),
                    "case {case}: MILP {} vs model {t}",
                    h.objective
                );
                assert!(
                    close(t, b.0),
                    "case {case}: exact {t} ({h:?}) vs optimum {b:?}"
                );
            }
        }
        checked += 1;
        let global = global.unwrap();

        // The paper's set iteration: optimal within the set assignment it ends in —
        // its ILP's objective is the model's T there, and no (w, n) with the same sets
        // does better — but that assignment is not always the best one.
        let h = iteration::solve(&lda, &s, &paper).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let t = lda.predict_paper(&h.w, &h.n).total_s;
        assert!(
            close(t, h.objective),
            "case {case}: ILP {} vs model {t}",
            h.objective
        );
        let region = brute_force(&lda, Some(&h.sets)).expect("its own point is in its region");
        assert!(
            close(t, region.0),
            "case {case}: {h:?} vs its region's optimum {region:?}"
        );
        if !close(t, global.0) {
            set_misses.push(format!(
                "case {case}: L={n_layers} M={m_count}: sets {:?} w={:?} n={:?} T={:.2} ms; optimum w={:?} n={:?} T={:.2} ms with sets {:?}",
                h.sets, h.w, h.n, t * 1e3, global.1, global.2, global.0 * 1e3,
                lda.assign_sets(
                    &global.1.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                    &global.2.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                    &vec![false; lda.len()],
                )
            ));
        }
    }
    // Why the iteration misses: each ILP's constraints keep its solution inside the set
    // assignment it was built for (M1–M3 devices must stay overloaded, M4 ones must not),
    // so re-assigning sets from that solution reproduces the same sets and the loop stops
    // after one round; only calibration moves a device, and only into M4. An optimum
    // whose sets differ from the start's (proportional to memory) is reached only if
    // calibration happens to lead there.
    eprintln!(
        "{checked} feasible instances; the set iteration ends in a non-optimal set assignment on {}:",
        set_misses.len()
    );
    for m in &set_misses {
        eprintln!("  {m}");
    }
    assert!(checked >= 60, "only {checked} feasible instances");
}
