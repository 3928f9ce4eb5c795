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

    // Twelve layers' worth of budget: room for two streamed chunks is kept out of it,
    // the first layers that fit the rest stay resident, and the others are cut into
    // chunks within their windows, in execution order, each layer once.
    let budget: u64 = (0..12).map(layer).sum();
    let plan = Residency::plan(
        &model,
        &windows(),
        Some(budget),
        true,
        ReleasePolicy::Mru,
        ReleaseMethod::Pageout,
    );
    let pieces = plan.windows();
    let resident: Vec<usize> = pieces
        .iter()
        .filter(|w| w.fully_resident())
        .flat_map(|w| w.layers.clone())
        .collect();
    assert!(
        (6..12).contains(&resident.len()),
        "{} resident",
        resident.len()
    );
    assert_eq!(resident, (0..resident.len()).collect::<Vec<_>>());
    assert_eq!(
        plan.streamed_bytes(),
        (resident.len()..20).map(layer).sum::<u64>()
    );
    let order: Vec<usize> = pieces.iter().flat_map(|w| w.layers.clone()).collect();
    assert_eq!(order, (0..20).collect::<Vec<_>>());
    for w in pieces {
        assert_eq!(w.round, usize::from(w.layers.start >= 10), "{w:?}");
        assert!(w.fully_resident() || w.resident_ranges.is_empty(), "{w:?}");
    }
    assert!(pieces.iter().filter(|w| w.round == 1).count() > 1);
    for w in pieces {
        let bytes: u64 = w.layers.clone().map(layer).sum();
        let expected = if w.fully_resident() { 0 } else { bytes };
        assert_eq!((w.bytes, w.streamed_bytes), (bytes, expected), "{w:?}");
    }

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
