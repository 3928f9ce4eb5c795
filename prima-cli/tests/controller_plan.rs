//! The cluster controller's planner, called in-process (no `prima` binary): the paper's
//! testbed manifests plan as the paper reports, and a manual manifest keeps its windows.
//! `prima apply --dry-run --json` keeps one end-to-end test of its own (`apply.rs`).

mod halda_support;

use std::sync::Once;

use prima_cluster::controller::{plan, Plan, PlanInputs};
use prima_cluster::manifest::LoadedManifest;
use prima_cluster::prp::key::LinkSecurity;
use prima_core::model::Model;

/// Plans a manifest whose devices' profiles come from a fixture file (`policy.profiles`),
/// on the synthetic model `model_tag`, with the plugins built for the tests.
fn plan_manifest(manifest: &std::path::Path, model_tag: &str) -> Plan {
    static PLUGINS: Once = Once::new();
    // Set once, before any plan in this test binary reads it.
    PLUGINS.call_once(|| std::env::set_var("PRIMA_PLUGIN_DIR", halda_support::plugin_dir()));
    let mut manifest = LoadedManifest::load(manifest).unwrap();
    let model_path = halda_support::model_path(model_tag);
    manifest.override_model(&model_path).unwrap();
    let model = Model::load(&model_path).unwrap();
    let head = manifest.head_index().unwrap();
    plan(&PlanInputs {
        manifest: &manifest,
        model: &model,
        head,
        backend: None,
        gpu: None,
        transport: None,
        addr_of: &|_| None,
        known: &[],
        security: &LinkSecurity::Insecure,
        draft: None,
    })
    .unwrap_or_else(|e| panic!("{}: {e:#}", manifest.path.display()))
}

fn testbed(name: &str) -> std::path::PathBuf {
    halda_support::workspace_root()
        .join("manifests/testbeds")
        .join(name)
}

fn with_layers(plan: &Plan) -> Vec<&str> {
    plan.devices
        .iter()
        .filter(|d| d.layers > 0)
        .map(|d| d.name.as_str())
        .collect()
}

#[test]
fn testbed_manifests_plan_as_the_paper_reports() {
    // 8B on D1–D4 goes entirely to D3's GPU; D2 and D4 are pruned.
    let p = plan_manifest(&testbed("d1-d4-llama3-8b.toml"), "llama3-8b-q4_k");
    assert_eq!(with_layers(&p), ["D3"]);
    let d3 = &p.devices[2];
    assert_eq!((d3.w, d3.n), (32, 32));
    let pruned: Vec<&str> = p
        .devices
        .iter()
        .filter(|d| d.pruned.is_some())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(pruned, ["D2", "D4"]);
    // The ring the head launches skips the pruned devices, head first.
    let ring: Vec<&str> = p.ring().map(|d| d.name.as_str()).collect();
    assert_eq!(ring, ["D1", "D3"]);

    // 70B needs every device of D1–D4.
    let p = plan_manifest(&testbed("d1-d4-llama3-70b.toml"), "llama3-70b-q4_k");
    assert_eq!(with_layers(&p), ["D1", "D2", "D3", "D4"]);
    assert!(p.predicted_tpot_ms.unwrap() > 0.0);
    assert_eq!(p.scheduler, "halda");

    // On the ten-node bed, 70B uses few devices and drops the weak ones.
    let p = plan_manifest(&testbed("ten-node-llama3-70b.toml"), "llama3-70b-q4_k");
    let used = with_layers(&p);
    assert!(used.len() <= 4, "{used:?}");
    assert_eq!(p.devices.iter().map(|d| d.layers).sum::<usize>(), 80);
    // The table a person reads names every device.
    let table = p.table();
    for d in &p.devices {
        assert!(table.contains(&d.name), "{table}");
    }
}

#[test]
fn the_json_plan_has_the_documented_fields() {
    let p = plan_manifest(&testbed("d1-d4-llama3-70b.toml"), "llama3-70b-q4_k");
    let v = p.to_json();
    assert_eq!(v["k"].as_u64().unwrap() as usize, p.k);
    for d in v["devices"].as_array().unwrap() {
        for field in ["name", "addr", "w", "n", "layers", "pruned", "relay", "set"] {
            assert!(d.get(field).is_some(), "{field} missing in {d}");
        }
    }
}
