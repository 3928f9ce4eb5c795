//! The mixture-of-experts feed-forward block (`qwen3moe`, `gpt-oss`) on small files built
//! here with the GGUF writer: broken files are errors naming the key or tensor; a
//! one-expert model computes exactly the dense `qwen3` block; a batch's rows (a prompt in
//! one batch, several slots in one decode step) get exactly the logits each gets alone,
//! however the rows are grouped by expert (gpt-oss: with its sinks, biases, sliding
//! window and clamped SwiGLU too). Agreement with llama.cpp is `golden_generation.rs` and
//! `perplexity.rs` (the generated `tiny-qwen3moe-*` models).

mod common;

use std::path::PathBuf;

use prima_core::batch::{BatchForward, SeqTokens};
use prima_core::gguf::{GgmlType, GgufWriter, Value};
use prima_core::model::{Model, ModelError, Session};

const D: u64 = 64;
const HEAD: u64 = 16;
const FF: u64 = 64;
const VOCAB: u64 = 300;

/// How a test file differs from a valid `qwen3moe` of `n_expert` experts, `k` per token.
#[derive(Clone, Copy)]
struct Variant {
    n_expert: u64,
    k: u64,
    /// The experts the 3-D tensors hold (`n_expert` in a valid file).
    tensor_experts: u64,
    /// Leave this tensor of layer 1 out (e.g. `ffn_up_exps.weight`).
    drop: Option<&'static str>,
}

impl Variant {
    fn valid(n_expert: u64, k: u64) -> Variant {
        Variant {
            n_expert,
            k,
            tensor_experts: n_expert,
            drop: None,
        }
    }
}

/// Deterministic pseudo-normal values (an LCG; the sum of four uniforms, centred).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> f32 {
        let mut s = 0.0;
        for _ in 0..4 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s += (self.0 >> 40) as f32 / (1u64 << 24) as f32;
        }
        (s - 2.0) * 3.0f32.sqrt()
    }
}

/// A two-layer model of architecture `arch`; a `qwen3moe` gets `v`'s experts, a `qwen3`
/// the dense block whose weights are expert 0's (so a one-expert MoE equals it).
fn model_bytes(arch: &str, v: Variant) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let u = |n: u64| Value::U32(n as u32);
    let key = |k: &str| format!("{arch}.{k}");
    w.add("general.architecture", Value::String(arch.into()));
    for (k, n) in [
        ("block_count", 2),
        ("context_length", 256),
        ("embedding_length", D),
        ("feed_forward_length", FF),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("attention.key_length", HEAD),
        ("attention.value_length", HEAD),
    ] {
        w.add(&key(k), u(n));
    }
    let moe = arch != "qwen3";
    let oss = arch == "gpt-oss";
    if moe {
        w.add(&key("expert_count"), u(v.n_expert));
        w.add(&key("expert_used_count"), u(v.k));
        w.add(&key("expert_feed_forward_length"), u(FF));
    }
    if oss {
        // Layer 0 local (a window of 4 positions), layer 1 global; YaRN on both.
        w.add(&key("attention.sliding_window"), u(4));
        w.add(&key("rope.scaling.type"), Value::String("yarn".into()));
        w.add(&key("rope.scaling.factor"), Value::F32(32.0));
        w.add(&key("rope.scaling.original_context_length"), u(64));
    }
    w.add(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    w.add(&key("rope.freq_base"), Value::F32(1e6));
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.add("tokenizer.ggml.pre", Value::String("default".into()));
    let tokens: Vec<Value> = (0..VOCAB).map(|i| Value::String(format!("t{i}"))).collect();
    w.add("tokenizer.ggml.tokens", Value::Array(tokens));
    w.add(
        "tokenizer.ggml.token_type",
        Value::Array(vec![Value::I32(1); VOCAB as usize]),
    );
    w.add("tokenizer.ggml.merges", Value::Array(vec![]));

    let s = |n: u64| 1.0 / (n as f32).sqrt();
    plain(&mut w, "token_embd.weight", &[D, VOCAB], 1.0, 0.0);
    for il in 0..2 {
        let t = |x: &str| format!("blk.{il}.{x}");
        // Every tensor but the one the variant leaves out.
        let kept = |x: &str| !(il == 1 && v.drop == Some(x));
        plain(&mut w, &t("attn_norm.weight"), &[D], 0.1, 1.0);
        plain(&mut w, &t("attn_q.weight"), &[D, 4 * HEAD], s(D), 0.0);
        plain(&mut w, &t("attn_k.weight"), &[D, 2 * HEAD], s(D), 0.0);
        plain(&mut w, &t("attn_v.weight"), &[D, 2 * HEAD], s(D), 0.0);
        if oss {
            plain(&mut w, &t("attn_q.bias"), &[4 * HEAD], 0.3, 0.0);
            plain(&mut w, &t("attn_k.bias"), &[2 * HEAD], 0.3, 0.0);
            plain(&mut w, &t("attn_v.bias"), &[2 * HEAD], 0.3, 0.0);
            plain(&mut w, &t("attn_output.bias"), &[D], 0.3, 0.0);
            if kept("attn_sinks.weight") {
                plain(&mut w, &t("attn_sinks.weight"), &[4], 1.0, 1.0);
            }
        } else {
            plain(&mut w, &t("attn_q_norm.weight"), &[HEAD], 0.1, 1.0);
            plain(&mut w, &t("attn_k_norm.weight"), &[HEAD], 0.1, 1.0);
        }
        plain(
            &mut w,
            &t("attn_output.weight"),
            &[4 * HEAD, D],
            s(4 * HEAD),
            0.0,
        );
        let ffn_norm = if oss {
            "post_attention_norm.weight"
        } else {
            "ffn_norm.weight"
        };
        plain(&mut w, &t(ffn_norm), &[D], 0.1, 1.0);
        if oss {
            let ne = v.n_expert;
            plain(&mut w, &t("ffn_gate_inp.bias"), &[ne], 0.5, 0.0);
            for (name, dims) in [
                ("ffn_gate_exps.bias", [FF, ne]),
                ("ffn_up_exps.bias", [FF, ne]),
                ("ffn_down_exps.bias", [D, ne]),
            ] {
                if kept(name) {
                    plain(&mut w, &t(name), &dims, 0.3, 0.0);
                }
            }
        }
        if moe {
            plain(
                &mut w,
                &t("ffn_gate_inp.weight"),
                &[D, v.n_expert],
                3.0 * s(D),
                0.0,
            );
            // Expert tensors under the dense names' seeds, so expert 0 of a one-expert
            // file is the dense file's block; gpt-oss's gate and up three times wider, so
            // some values pass its SwiGLU's clamp.
            let ne = v.tensor_experts;
            let gate_up = [D, FF, ne];
            let gain = if oss { 3.0 } else { 1.0 };
            add_tensor(
                &mut w,
                &t("ffn_gate_exps.weight"),
                &t("ffn_gate.weight"),
                &gate_up,
                gain * s(D),
                0.0,
            );
            if kept("ffn_up_exps.weight") {
                add_tensor(
                    &mut w,
                    &t("ffn_up_exps.weight"),
                    &t("ffn_up.weight"),
                    &gate_up,
                    gain * s(D),
                    0.0,
                );
            }
            add_tensor(
                &mut w,
                &t("ffn_down_exps.weight"),
                &t("ffn_down.weight"),
                &[FF, D, ne],
                s(FF),
                0.0,
            );
        } else {
            plain(&mut w, &t("ffn_gate.weight"), &[D, FF], s(D), 0.0);
            plain(&mut w, &t("ffn_up.weight"), &[D, FF], s(D), 0.0);
            plain(&mut w, &t("ffn_down.weight"), &[FF, D], s(FF), 0.0);
        }
    }
    plain(&mut w, "output_norm.weight", &[D], 0.1, 1.0);
    plain(&mut w, "output.weight", &[D, VOCAB], 3.0 * s(D), 0.0);
    w.to_bytes()
}

/// [`add_tensor`] seeded by its own name.
fn plain(w: &mut GgufWriter, name: &str, dims: &[u64], scale: f32, offset: f32) {
    add_tensor(w, name, name, dims, scale, offset)
}

/// Adds an F32 tensor of `offset + scale · noise`, the noise seeded by `seed_name`: a
/// tensor's values do not depend on which others exist, and an expert tensor seeded by
/// a dense tensor's name starts with that tensor's values.
fn add_tensor(
    w: &mut GgufWriter,
    name: &str,
    seed_name: &str,
    dims: &[u64],
    scale: f32,
    offset: f32,
) {
    let seed = seed_name
        .bytes()
        .fold(17u64, |h, b| h.wrapping_mul(31) ^ b as u64);
    let mut noise = Noise(seed);
    let n: u64 = dims.iter().product();
    let data: Vec<u8> = (0..n)
        .flat_map(|_| (offset + scale * noise.next()).to_le_bytes())
        .collect();
    w.add_tensor(name, dims, GgmlType::F32, &data).unwrap();
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prima-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn load(name: &str, arch: &str, v: Variant) -> Result<Model, ModelError> {
    Model::load(write(name, &model_bytes(arch, v)))
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 37 + 11) % VOCAB as usize) as u32)
        .collect()
}

#[test]
fn broken_files_are_errors_naming_the_key_or_tensor() {
    let missing = Variant {
        drop: Some("ffn_up_exps.weight"),
        ..Variant::valid(4, 2)
    };
    let err = load("missing.gguf", "qwen3moe", missing)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("blk.1.ffn_up_exps.weight"), "{err}");

    let count = Variant {
        tensor_experts: 3,
        ..Variant::valid(4, 2)
    };
    let err = load("count.gguf", "qwen3moe", count)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("blk.0.ffn_gate_exps.weight")
            && err.contains("qwen3moe.expert_count = 4")
            && err.contains("holds 3 experts"),
        "{err}"
    );

    let err = load("top_k.gguf", "qwen3moe", Variant::valid(4, 5))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("qwen3moe.expert_used_count = 5") && err.contains("qwen3moe.expert_count = 4"),
        "{err}"
    );

    assert!(load("valid.gguf", "qwen3moe", Variant::valid(4, 2)).is_ok());
}

/// A gpt-oss file without its attention sinks or an expert bias is an error naming the
/// tensor; an expert bias of another type than F32 too.
#[test]
fn gpt_oss_without_sinks_or_expert_biases_is_an_error_naming_the_tensor() {
    for tensor in [
        "attn_sinks.weight",
        "ffn_gate_exps.bias",
        "ffn_up_exps.bias",
        "ffn_down_exps.bias",
    ] {
        let v = Variant {
            drop: Some(tensor),
            ..Variant::valid(4, 2)
        };
        let err = load(&format!("oss-no-{tensor}.gguf"), "gpt-oss", v)
            .err()
            .unwrap_or_else(|| panic!("a file without blk.1.{tensor} loaded"))
            .to_string();
        assert!(err.contains(&format!("blk.1.{tensor}")), "{err}");
    }
    let model = load("oss.gguf", "gpt-oss", Variant::valid(4, 2)).unwrap();
    let hp = model.hparams();
    assert_eq!(
        (hp.is_local(0), hp.is_local(1), hp.sliding_window),
        (true, false, 4)
    );
}

/// gpt-oss (8 experts, 2 per token; sinks, biases, a 4-position window on layer 0, YaRN,
/// the clamped SwiGLU): a 24-token prompt in one batch gives each row the logits it gets
/// token by token, and logits are finite and not flat.
#[test]
fn gpt_oss_batched_rows_equal_rows_alone() {
    let backend = common::cpu_backend(2);
    let model = load("oss-eight.gguf", "gpt-oss", Variant::valid(8, 2)).unwrap();
    let tokens = prompt(24);
    let mut one_by_one = Session::new(&model, &backend.backend, 64, 64).unwrap();
    let mut alone = Vec::new();
    for &t in &tokens {
        alone.push(one_by_one.eval(&[t]).unwrap().to_vec());
    }
    let mut batched = Session::new(&model, &backend.backend, 64, 64).unwrap();
    batched.eval(&tokens).unwrap();
    let n_vocab = VOCAB as usize;
    let mut rows = vec![0.0; tokens.len() * n_vocab];
    batched.logits_rows(0..tokens.len(), &mut rows).unwrap();
    for (i, want) in alone.iter().enumerate() {
        assert_eq!(&rows[i * n_vocab..(i + 1) * n_vocab], &want[..], "row {i}");
    }
    let last = alone.last().unwrap();
    assert!(last.iter().all(|x| x.is_finite()));
    let (lo, hi) = last
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    assert!(hi - lo > 1.0, "flat logits {lo}..{hi}");
}

#[test]
fn one_expert_computes_the_dense_block() {
    let backend = common::cpu_backend(2);
    let dense = load("dense.gguf", "qwen3", Variant::valid(1, 1)).unwrap();
    let moe = load("one_expert.gguf", "qwen3moe", Variant::valid(1, 1)).unwrap();
    let tokens = prompt(12);
    let mut a = Session::new(&dense, &backend.backend, 64, 64).unwrap();
    let mut b = Session::new(&moe, &backend.backend, 64, 64).unwrap();
    let want = a.eval(&tokens).unwrap().to_vec();
    assert_eq!(b.eval(&tokens).unwrap(), &want[..]);
    let want = a.eval(&[5]).unwrap().to_vec();
    assert_eq!(b.eval(&[5]).unwrap(), &want[..]);
}

/// 8 experts, 2 per token: a 24-token prompt in one batch gives each row the logits it
/// gets token by token, and so does a decode step of three slots at once.
#[test]
fn batched_rows_equal_rows_alone() {
    let backend = common::cpu_backend(2);
    let model = load("eight.gguf", "qwen3moe", Variant::valid(8, 2)).unwrap();
    let tokens = prompt(24);

    let mut one_by_one = Session::new(&model, &backend.backend, 64, 64).unwrap();
    let mut alone = Vec::new();
    for &t in &tokens {
        alone.push(one_by_one.eval(&[t]).unwrap().to_vec());
    }
    let mut batched = Session::new(&model, &backend.backend, 64, 64).unwrap();
    batched.eval(&tokens).unwrap();
    let n_vocab = VOCAB as usize;
    let mut rows = vec![0.0; tokens.len() * n_vocab];
    batched.logits_rows(0..tokens.len(), &mut rows).unwrap();
    for (i, want) in alone.iter().enumerate() {
        assert_eq!(&rows[i * n_vocab..(i + 1) * n_vocab], &want[..], "row {i}");
    }

    // Three slots with different prompts, then one decode step of all three.
    let prompts = [prompt(5), prompt(9)[4..].to_vec(), vec![7, 8, 9]];
    let mut slots = Session::with_slots(&model, &backend.backend, 64, 64, 3).unwrap();
    let seqs: Vec<SeqTokens> = prompts
        .iter()
        .enumerate()
        .map(|(slot, t)| SeqTokens { slot, tokens: t })
        .collect();
    slots.eval_batch(&seqs).unwrap();
    let next = [[1u32], [2], [3]];
    let step: Vec<SeqTokens> = next
        .iter()
        .enumerate()
        .map(|(slot, t)| SeqTokens { slot, tokens: t })
        .collect();
    let together = slots.eval_batch(&step).unwrap().to_vec();
    for (slot, p) in prompts.iter().enumerate() {
        let mut s = Session::new(&model, &backend.backend, 64, 64).unwrap();
        s.eval(p).unwrap();
        let want = s.eval(&next[slot]).unwrap();
        assert_eq!(
            &together[slot * n_vocab..(slot + 1) * n_vocab],
            want,
            "slot {slot}"
        );
    }
}
