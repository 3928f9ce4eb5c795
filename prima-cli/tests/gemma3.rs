//! Gemma 3's hyper-parameters as the model layer reads them from metadata. Its outputs
//! against llama.cpp are checked in `golden_generation.rs` with every other model.

mod common;

use prima_core::model::Model;

/// Gemma 3's layer pattern and RoPE bases come from metadata: 18 layers, every sixth
/// global, local layers with a 512-token window and base 10 000, global ones 1e6.
#[test]
fn gemma3_hyper_parameters() {
    let Some(path) =
        common::model_or_skip(common::workspace_models().join("gemma-3-270m-q4_k_m.gguf"))
    else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let hp = model.hparams();
    assert_eq!((hp.n_layers, hp.n_embd, hp.head_dim_k), (18, 640, 256));
    assert_eq!(hp.sliding_window, 512);
    let globals: Vec<usize> = (0..hp.n_layers).filter(|&il| !hp.is_local(il)).collect();
    assert_eq!(globals, [5, 11, 17]);
    assert_eq!(hp.rope_freq_base, 1_000_000.0);
    assert_eq!(hp.rope_freq_base_local, 10_000.0);
    assert_eq!(hp.attention_scale, 1.0 / 16.0);
}
