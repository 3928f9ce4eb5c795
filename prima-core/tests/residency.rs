//! Residency plans keep layers resident in execution order up to the budget, and page
//! hints never change what the mapping reads.

mod common;

use common::{model_or_skip, workspace_models};
use prima_core::gguf::PageHint;
use prima_core::model::Model;
use prima_core::prp::protocol::{ReleaseMethod, ReleasePolicy, RoundWindow};
use prima_core::prp::residency::Residency;

fn windows() -> Vec<RoundWindow> {
    vec![
        RoundWindow {
            round: 0,
            layers: 0..10,
        },
        RoundWindow {
            round: 1,
            layers: 10..20,
        },
    ]
}

#[test]
fn layers_stay_resident_in_execution_order_up_to_the_budget() {
    let Some(path) = model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let layer = |il| model.layer_bytes(il);
    let all = Residency::plan(
        &model,
        &windows(),
        None,
        true,
        ReleasePolicy::Mru,
        ReleaseMethod::Pageout,
    );
    assert_eq!(
        (
            all.resident_count(),
            all.streamed_count(),
            all.streamed_bytes()
        ),
        (2, 0, 0)
    );

    let budget: u64 = (0..12).map(layer).sum();
    let plan = Residency::plan(
        &model,
        &windows(),
        Some(budget),
        true,
        ReleasePolicy::Mru,
        ReleaseMethod::Pageout,
    );
    assert_eq!(plan.resident_count(), 1);
    assert_eq!(plan.streamed_count(), 1);
    assert_eq!(plan.streamed_bytes(), (12..20).map(layer).sum::<u64>());
    let w = &plan.windows()[1];
    let first_streamed = model.layer_tensors(12).map(|t| t.offset).min().unwrap();
    assert!(w.streamed_ranges.iter().all(|r| r.end > first_streamed));
    assert!(w.resident_ranges.iter().all(|r| r.start < first_streamed));
    assert_eq!(w.bytes, (10..20).map(layer).sum::<u64>());

    // A budget smaller than the first layer streams everything.
    let none = Residency::plan(
        &model,
        &windows(),
        Some(1),
        false,
        ReleasePolicy::None,
        ReleaseMethod::Cold,
    );
    assert_eq!(none.streamed_bytes(), (0..20).map(layer).sum::<u64>());
}

#[test]
fn page_hints_never_change_the_bytes_read() {
    let Some(path) = model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let t = model
        .layer_tensors(3)
        .max_by_key(|t| t.n_bytes)
        .unwrap()
        .clone();
    let before = model.gguf().tensor_data(&t).to_vec();
    for hint in [
        PageHint::WillNeed,
        PageHint::Cold,
        PageHint::PageOut,
        PageHint::DontNeed,
    ] {
        model
            .gguf()
            .advise_pages(t.offset..t.offset + t.n_bytes, hint)
            .unwrap_or_else(|e| panic!("{}: {e}", hint.name()));
        assert!(
            model.gguf().tensor_data(&t) == &before[..],
            "{} changed the data",
            hint.name()
        );
    }
}
