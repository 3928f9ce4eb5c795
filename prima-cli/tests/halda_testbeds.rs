//! Halda on the paper's testbeds (`manifests/testbeds/`) with the paper's models as sparse
//! synthetic files: the structural results the paper reports, checked on our plans.

mod halda_support;

use halda_support::{devices, model, os_models, solver, testbed};
use prima_cluster::halda::{self, LdaSet, ModelProfile, Plan, PlanOptions, Scheduler};
use prima_cluster::profile::DeviceProfile;

fn plan(model: &ModelProfile, devs: &[DeviceProfile], scheduler: Scheduler) -> Plan {
    let s = solver();
    halda::plan(
        model,
        devs,
        scheduler,
        Some(&s),
        &os_models(),
        &PlanOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{scheduler:?} on {}: {e}", model.name))
}

fn describe(p: &Plan) -> String {
    let devs: Vec<String> = p
        .devices
        .iter()
        .map(|d| {
            if d.pruned {
                format!("{}:pruned", d.name)
            } else {
                format!(
                    "{}:w{}n{}{}",
                    d.name,
                    d.w,
                    d.n,
                    d.set.map(|s| s.name()).unwrap_or("")
                )
            }
        })
        .collect();
    format!(
        "{:?} k={} tpot={:.1}ms [{}] solve={:.2}ms",
        p.scheduler,
        p.k,
        p.predicted_tpot_ms,
        devs.join(" "),
        p.solve_ms
    )
}

/// Invariants every plan keeps: the windows cover L exactly k times, n ≤ w, GPU layers
/// fit the GPU, pruned devices hold nothing.
fn check_plan(p: &Plan) {
    let active: Vec<_> = p.active().collect();
    assert!(!active.is_empty(), "{}", describe(p));
    let big_w: u32 = active.iter().map(|d| d.w).sum();
    let l: u32 = active.iter().map(|d| d.load.as_ref().unwrap().l).sum();
    assert_eq!(l, p.n_layers, "{}", describe(p));
    if p.scheduler == Scheduler::Halda {
        assert_eq!(big_w * p.k, p.n_layers, "{}", describe(p));
    }
    for (i, d) in p.devices.iter().enumerate() {
        if d.pruned {
            assert_eq!((d.w, d.n), (0, 0));
            continue;
        }
        let load = d.load.as_ref().unwrap();
        // The head (first) may run no layer; it still embeds and runs the output head.
        assert!((d.w >= 1 || i == 0) && d.n <= d.w, "{}", describe(p));
        assert!(
            load.vram_bytes <= load.vram_capacity_bytes + 1.0 || load.l_gpu == 0,
            "{}: VRAM {} > {}",
            d.name,
            load.vram_bytes,
            load.vram_capacity_bytes
        );
    }
}

#[test]
fn llama3_8b_on_d1_d4_runs_entirely_on_d3_gpu() {
    let devs = devices("d1-d6", &["D1", "D2", "D3", "D4"]);
    let m = model("llama3-8b-q4_k");
    let p = plan(&m, &devs, Scheduler::Halda);
    eprintln!("8B on D1-D4: {}", describe(&p));
    check_plan(&p);
    // The head may stay as the ring's input and output with no layer of its own.
    let active: Vec<_> = p.active().filter(|d| d.w > 0).collect();
    assert_eq!(active.len(), 1, "{}", describe(&p));
    assert_eq!(active[0].name, "D3");
    assert_eq!(
        active[0].n,
        active[0].w,
        "every layer on D3's GPU: {}",
        describe(&p)
    );
    for d in p
        .devices
        .iter()
        .filter(|d| d.name != "D3" && d.name != "D1")
    {
        assert!(d.pruned && !d.relay, "{}", describe(&p));
        assert!(d.reason.is_some());
    }
}

#[test]
fn more_slots_ask_for_more_memory() {
    // Continuous batching's slots each keep a KV cache: the plan's memory grows with them.
    let devs = devices("d1-d6", &["D1", "D2", "D3", "D4"]);
    let m = model("llama3-70b-q4_k");
    let lda = |n_slots: usize| {
        let opts = PlanOptions {
            n_slots,
            ..PlanOptions::default()
        };
        let refs: Vec<&DeviceProfile> = devs.iter().collect();
        halda::Lda::new(&m, &refs, &[], &os_models(), &opts).unwrap()
    };
    let (one, four) = (lda(1), lda(4));
    let kv = m.kv_bytes_per_token * PlanOptions::default().n_kv;
    assert!(
        (four.b_prime - one.b_prime - 3.0 * kv).abs() < 1.0,
        "b' grows by a KV cache per slot"
    );
    // The same placement needs more RAM with more slots, and the planner sees it.
    let p = plan(&m, &devs, Scheduler::Halda);
    let w: Vec<u32> = p.devices.iter().map(|d| d.w).collect();
    let n: Vec<u32> = p.devices.iter().map(|d| d.n).collect();
    let ram = |lda: &halda::Lda| -> f64 {
        lda.predict(&w, &n)
            .devices
            .iter()
            .map(|d| d.ram_bytes)
            .sum()
    };
    assert!(
        ram(&four) > ram(&one) + kv,
        "{} vs {}",
        ram(&four),
        ram(&one)
    );
    let s = solver();
    let opts = PlanOptions {
        n_slots: 4,
        ..PlanOptions::default()
    };
    let p4 = halda::plan(&m, &devs, Scheduler::Halda, Some(&s), &os_models(), &opts).unwrap();
    check_plan(&p4);
    eprintln!("1 slot: {}\n4 slots: {}", describe(&p), describe(&p4));
}

#[test]
fn llama3_70b_on_d1_d4_respects_memory_and_beats_the_baselines() {
    let devs = devices("d1-d6", &["D1", "D2", "D3", "D4"]);
    let m = model("llama3-70b-q4_k");
    let h = plan(&m, &devs, Scheduler::Halda);
    let mem = plan(&m, &devs, Scheduler::Mem);
    let perf = plan(&m, &devs, Scheduler::Perf);
    for p in [&h, &mem, &perf] {
        eprintln!("70B on D1-D4: {}", describe(p));
        check_plan(p);
    }
    // No device beyond its bounds: VRAM always (check_plan); RAM for devices that must
    // not overload (M4: enough memory, a slow disk, or forced by calibration); devices in
    // M1–M3 overload by design (mmapped weights are reloaded, never OOM).
    for d in h.active() {
        let load = d.load.as_ref().unwrap();
        if d.set == Some(LdaSet::M4) {
            assert!(
                load.ram_bytes <= load.budget_bytes,
                "{} in M4 uses {} of {}",
                d.name,
                load.ram_bytes,
                load.budget_bytes
            );
            assert_eq!(load.reload_bytes, 0.0);
        } else {
            assert!(
                load.ram_bytes > load.budget_bytes,
                "{} is in {:?} but not overloaded",
                d.name,
                d.set
            );
        }
    }
    assert!(
        h.predicted_tpot_ms < mem.predicted_tpot_ms,
        "Halda {:.1} ms vs MemSched {:.1} ms",
        h.predicted_tpot_ms,
        mem.predicted_tpot_ms
    );
    assert!(
        h.predicted_tpot_ms < perf.predicted_tpot_ms,
        "Halda {:.1} ms vs PerfSched {:.1} ms",
        h.predicted_tpot_ms,
        perf.predicted_tpot_ms
    );
}

#[test]
fn llama3_70b_on_ten_nodes_uses_few_devices_and_drops_weak_ones() {
    let devs = testbed("ten-node");
    let m = model("llama3-70b-q4_k");
    let p = plan(&m, &devs, Scheduler::Halda);
    eprintln!("70B on ten nodes: {}", describe(&p));
    check_plan(&p);
    let active: Vec<&str> = p.active().map(|d| d.name.as_str()).collect();
    assert!(active.len() <= 4, "{}", describe(&p));
    // The CPU-only devices with the weakest CPUs (the paper's D1 and D8) do not take part.
    for weak in ["D1", "D8"] {
        assert!(!active.contains(&weak), "{weak} kept: {}", describe(&p));
    }
    // The 3090 (24 GiB VRAM) is the backbone of the plan.
    assert!(active.contains(&"D2"), "{}", describe(&p));
}

#[test]
fn small_models_on_ten_nodes_reduce_to_the_3090() {
    let devs = testbed("ten-node");
    for tag in ["llama3-8b-q4_k", "llama3-14b-q4_k"] {
        let p = plan(&model(tag), &devs, Scheduler::Halda);
        eprintln!("{tag} on ten nodes: {}", describe(&p));
        check_plan(&p);
        let active: Vec<&str> = p
            .active()
            .filter(|d| d.w > 0)
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(active, ["D2"], "{}", describe(&p));
    }
}

#[test]
fn every_paper_model_plans_on_every_testbed() {
    let beds: [(&str, Vec<DeviceProfile>); 5] = [
        ("d1-d4", devices("d1-d6", &["D1", "D2", "D3", "D4"])),
        ("d1-d6", testbed("d1-d6")),
        ("ten-node", testbed("ten-node")),
        ("homogeneous-4", testbed("homogeneous-4")),
        ("ablation-4", testbed("ablation-4")),
    ];
    for tag in [
        "llama3-8b-q4_k",
        "llama3-14b-q4_k",
        "llama3-70b-q4_k",
        "qwen2.5-32b-q4_k",
        "qwen2.5-72b-q4_k",
    ] {
        let m = model(tag);
        for (bed, devs) in &beds {
            let h = plan(&m, devs, Scheduler::Halda);
            check_plan(&h);
            let mem = plan(&m, devs, Scheduler::Mem);
            let perf = plan(&m, devs, Scheduler::Perf);
            check_plan(&mem);
            check_plan(&perf);
            eprintln!(
                "{tag:<17} {bed:<14} halda {:>9.1} ms  mem {:>9.1} ms  perf {:>9.1} ms  | {}",
                h.predicted_tpot_ms,
                mem.predicted_tpot_ms,
                perf.predicted_tpot_ms,
                describe(&h)
            );
            // Halda optimises the model both baselines are scored with.
            assert!(
                h.predicted_tpot_ms <= mem.predicted_tpot_ms * (1.0 + 1e-9),
                "{tag} on {bed}"
            );
            assert!(
                h.predicted_tpot_ms <= perf.predicted_tpot_ms * (1.0 + 1e-9),
                "{tag} on {bed}"
            );
        }
    }
}

#[test]
fn every_k_and_the_exact_program_give_valid_plans() {
    let s = solver();
    let os = os_models();
    let every_k = PlanOptions {
        every_k: true,
        ..PlanOptions::default()
    };
    let exact = PlanOptions {
        exact: true,
        ..PlanOptions::default()
    };
    for bed in ["d1-d6", "ten-node", "homogeneous-4"] {
        let devs = testbed(bed);
        for tag in ["llama3-8b-q4_k", "llama3-70b-q4_k", "qwen2.5-72b-q4_k"] {
            let m = model(tag);
            let p = plan(&m, &devs, Scheduler::Halda);
            let all = halda::plan(&m, &devs, Scheduler::Halda, Some(&s), &os, &every_k).unwrap();
            let ex = halda::plan(&m, &devs, Scheduler::Halda, Some(&s), &os, &exact).unwrap();
            check_plan(&ex);
            eprintln!(
                "{tag:<17} {bed:<14} paper {:>9.1} ms  every k {:>9.1} ms (k={})  exact {:>9.1} ms | {}",
                p.predicted_tpot_ms,
                all.predicted_tpot_ms,
                all.k,
                ex.predicted_tpot_ms,
                describe(&ex)
            );
            // Every plan is scored by the overlap model (`Lda::predict`), which the
            // paper's programs do not minimise: their orders need not agree any more.
            check_plan(&p);
            check_plan(&all);
        }
    }
}

/// The paper's ablation: on Llama 3 70B Halda beats MemSched and PerfSched "because it
/// learns to drop the 4th device" (the phone).
#[test]
fn llama3_70b_on_the_ablation_bed_drops_the_phone_and_beats_the_baselines() {
    let devs = testbed("ablation-4");
    let m = model("llama3-70b-q4_k");
    let h = plan(&m, &devs, Scheduler::Halda);
    let mem = plan(&m, &devs, Scheduler::Mem);
    let perf = plan(&m, &devs, Scheduler::Perf);
    for p in [&h, &mem, &perf] {
        eprintln!("70B on the ablation bed: {}", describe(p));
        check_plan(p);
    }
    let phone = h.devices.iter().find(|d| d.name == "phone").unwrap();
    assert!(phone.pruned, "{}", describe(&h));
    assert!(h.predicted_tpot_ms < mem.predicted_tpot_ms);
    assert!(h.predicted_tpot_ms < perf.predicted_tpot_ms);
}

/// Issue 38 with pinned profiles (the paper's D1–D4): under `output = "auto"` a model
/// that fits the best device runs there with the output layer beside it, the head only
/// embedding and sampling, and that is the fastest shape Halda weighed; a model that fits
/// no device is still a ring.
#[test]
fn a_model_that_fits_the_best_device_runs_there_with_its_output_layer() {
    let devs = devices("d1-d6", &["D1", "D2", "D3", "D4"]);
    let s = solver();
    let auto = PlanOptions {
        output: halda::OutputPolicy::Auto,
        ..PlanOptions::default()
    };
    let plan_with = |m: &ModelProfile, opts: &PlanOptions| {
        halda::plan(m, &devs, Scheduler::Halda, Some(&s), &os_models(), opts).unwrap()
    };
    let small = model("llama3-8b-q4_k");
    let p = plan_with(&small, &auto);
    eprintln!("8B on D1-D4, output auto: {}", describe(&p));
    for a in &p.alternatives {
        eprintln!("  weighed: {} {:.1} ms", a.shape, a.predicted_tpot_ms);
    }
    check_plan(&p);
    let with_layers: Vec<&str> = p
        .active()
        .filter(|d| d.w > 0)
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(with_layers, ["D3"], "{}", describe(&p));
    assert_eq!(p.output_device, "D3", "{}", describe(&p));
    assert!(
        p.alternatives.len() >= 3,
        "the ring, each device alone, the head alone"
    );
    assert!(
        p.alternatives
            .iter()
            .all(|a| p.predicted_tpot_ms <= a.predicted_tpot_ms + 1e-9),
        "the plan is the fastest shape weighed: {:?}",
        p.alternatives
    );
    // The head's output layer cost the plan on the head's slower CPU.
    let on_head = plan_with(&small, &PlanOptions::default());
    assert_eq!(on_head.output_device, "D1");
    assert!(
        p.predicted_tpot_ms < on_head.predicted_tpot_ms,
        "{} against {}",
        describe(&p),
        describe(&on_head)
    );

    let big = model("llama3-70b-q4_k");
    let p = plan_with(&big, &auto);
    eprintln!("70B on D1-D4, output auto: {}", describe(&p));
    check_plan(&p);
    assert!(
        p.active().filter(|d| d.w > 0).count() >= 2,
        "no device holds a 70B model: {}",
        describe(&p)
    );
}
