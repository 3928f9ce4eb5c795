//! A device profiled with a GPU backend beside its CPU one gets GPU layers from Halda
//! (n_m > 0), within its VRAM. No GPU here: a second CPU backend instance stands in, with
//! the memory a GPU plugin would report, and its measured figures are scaled to a GPU's
//! speed before planning (the figures' plumbing is what is under test, not this CPU).

mod common;
mod halda_support;

use std::path::PathBuf;

use common::{cpu_backend, model_or_skip, workspace_models};
use halda_support::{os_models, solver};
use prima_abi::backend::GpuMemory;
use prima_cluster::halda::{self, ModelProfile, Plan, PlanOptions, Scheduler};
use prima_cluster::profile::{
    profile_device_with_gpu, DeviceProfile, GpuKind, GpuProbe, ProfileOptions, QuantClass, GIB,
};
use prima_core::model::Model;

fn smollm2() -> Option<PathBuf> {
    model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// This device profiled with the "GPU" reporting `free` bytes of VRAM.
fn profiled(path: &std::path::Path, free: u64) -> DeviceProfile {
    let (cpu, gpu) = (cpu_backend(1), cpu_backend(1));
    let probe = GpuProbe {
        backend: &gpu.backend,
        name: "cpu-as-gpu",
        memory: GpuMemory {
            total_bytes: free * 2,
            free_bytes: free,
            unified: false,
        },
    };
    let options = ProfileOptions {
        name: Some("gpu-box".into()),
        refresh: true,
        ..ProfileOptions::default()
    };
    profile_device_with_gpu(&cpu.backend, "cpu", Some(probe), path, &options)
        .unwrap()
        .profile
}

fn plan(model: &ModelProfile, device: &DeviceProfile, opts: &PlanOptions) -> Plan {
    let s = solver();
    halda::plan(
        model,
        std::slice::from_ref(device),
        Scheduler::Halda,
        Some(&s),
        &os_models(),
        opts,
    )
    .unwrap()
}

#[test]
fn a_profiled_gpu_gets_layers_within_its_vram() {
    let Some(path) = smollm2() else { return };
    let model = ModelProfile::from_gguf(Model::load(&path).unwrap().gguf()).unwrap();
    let opts = PlanOptions::default();
    let b_prime = model.layer_bytes_with_kv(opts.n_kv * opts.n_slots.max(1) as f64);
    // Room for ten layers with their KV beside the GPU's fixed needs c^{gpu}.
    let free = (model.c_gpu + 10.5 * b_prime) as u64;
    let mut p = profiled(&path, free);

    // The profile's GPU fields come from the probe.
    assert_eq!(p.gpu, GpuKind::Cuda);
    assert!((p.gpu_available_gib - free as f64 / GIB).abs() < 1e-9);
    let rates = p.gpu_gflops.expect("s^{gpu} measured");
    assert!(QuantClass::ALL.iter().all(|&q| rates.flops_per_s(q) > 0.0));
    assert!(p.gpu_read_gb_s.is_some_and(|r| r > 0.0));
    assert!(p.gpu_copy_ms > 0.0);
    p.validate().unwrap();

    // A GPU twenty times this core, as discrete GPUs are beside one CPU core.
    let mut fast = rates;
    for q in QuantClass::ALL {
        fast.set(q, rates.flops_per_s(q) / 1e9 * 20.0);
    }
    p.gpu_gflops = Some(fast);
    p.gpu_read_gb_s = p.gpu_read_gb_s.map(|r| r * 20.0);
    p.gpu_copy_ms = 0.01;

    let planned = plan(&model, &p, &opts);
    let d = &planned.devices[0];
    let load = d.load.as_ref().unwrap();
    eprintln!(
        "k = {}, w = {}, n = {}, l_gpu = {}, VRAM {:.1} of {:.1} MiB",
        planned.k,
        d.w,
        d.n,
        load.l_gpu,
        load.vram_bytes / 1048576.0,
        load.vram_capacity_bytes / 1048576.0
    );
    assert!(d.n > 0, "a fast GPU gets layers: n = {}", d.n);
    assert!(
        load.l_gpu <= 10,
        "l_gpu = {} beyond the VRAM's ten",
        load.l_gpu
    );
    assert!(load.vram_bytes <= load.vram_capacity_bytes + 1.0);

    // With VRAM for every layer, every layer goes there.
    p.gpu_available_gib = 8.0;
    let planned = plan(&model, &p, &opts);
    let d = &planned.devices[0];
    assert_eq!(
        d.n, d.w,
        "all layers on a GPU they fit: n = {}, w = {}",
        d.n, d.w
    );
}
