//! Residency plans keep layers resident in execution order up to the budget, and page
//! hints never change what the mapping reads.

mod common;

use common::{model_or_skip, workspace_models};
use prima_cluster::prp::protocol::{ReleaseMethod, ReleasePolicy, RoundWindow};
use prima_cluster::prp::residency::Residency;
use prima_core::gguf::PageHint;
use prima_core::model::Model;

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

    // Twelve layers' worth of budget for twenty: each window streams its first layers,
    // as many in one as in the other, and keeps the rest resident beside room for one
    // round's reads (at least a layer, and the excess over the other round's wait);
    // every streamed layer is a piece of its own, in execution order, each layer once.
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
    let order: Vec<usize> = pieces.iter().flat_map(|w| w.layers.clone()).collect();
    assert_eq!(order, (0..20).collect::<Vec<_>>());
    let resident: Vec<usize> = pieces
        .iter()
        .filter(|w| w.fully_resident())
        .flat_map(|w| w.layers.clone())
        .collect();
    let in_window = |r: usize| resident.iter().filter(|&&il| il / 10 == r).count();
    assert!(in_window(0).abs_diff(in_window(1)) <= 1, "{resident:?}");
    assert!(!resident.is_empty() && resident.len() < 12, "{resident:?}");
    for r in 0..2 {
        let kept: Vec<usize> = resident.iter().copied().filter(|il| il / 10 == r).collect();
        assert_eq!(
            kept,
            (10 * r + 10 - kept.len()..10 * r + 10).collect::<Vec<_>>()
        );
    }
    let largest = (0..20).map(layer).max().unwrap();
    let resident_bytes: u64 = resident.iter().map(|&il| layer(il)).sum();
    assert!(
        resident_bytes + largest <= budget,
        "no room for a streamed layer"
    );
    assert_eq!(
        plan.streamed_bytes(),
        (0..20).map(layer).sum::<u64>() - resident_bytes
    );
    for w in pieces {
        assert_eq!(w.round, usize::from(w.layers.start >= 10), "{w:?}");
        assert!(w.fully_resident() || w.layers.len() == 1, "{w:?}");
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
