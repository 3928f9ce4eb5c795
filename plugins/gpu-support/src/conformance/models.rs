//! Whole models on both backends: generated Llama-shaped ones (every format mixed in) and
//! real ones; logits and greedy tokens over a prompt, fed steps and free-running steps.

use std::path::Path;
use std::time::Instant;

use prima_abi::backend::BackendBox;
use prima_core::gguf::{GgmlType, GgufWriter, Value};
use prima_core::model::{Model, Session};
use prima_core::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{argmax, max_abs, max_abs_diff, random_weight, top2_gap, Target, GAP};

/// A generated model's sizes.
#[derive(Debug, Clone, Copy)]
pub struct ModelShape {
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_vocab: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
}

impl ModelShape {
    /// `n` prompt tokens spread over the vocabulary (the last id, end of text, left out).
    pub fn prompt(&self, n: u32) -> Vec<u32> {
        (0..n)
            .map(|i| (i * 131 + 7) % (self.n_vocab as u32 - 1))
            .collect()
    }
}

/// Formats mixed through a generated model, layer by layer (`mixes[il % 2]`): every legacy
/// quant in one, every K-quant and F16 in the other.
pub const MIXED: [[GgmlType; 7]; 2] = {
    use GgmlType as T;
    [
        [
            T::Q4_0,
            T::Q4_1,
            T::Q8_0,
            T::Q5_0,
            T::Q4_1,
            T::Q5_1,
            T::Q8_0,
        ],
        [T::Q4K, T::Q3K, T::Q6K, T::Q4K, T::Q5K, T::Q2K, T::F16],
    ]
};

/// The token embedding's and output head's formats beside [`MIXED`].
pub const MIXED_HEAD: [GgmlType; 2] = [GgmlType::Q8_0, GgmlType::Q6K];

/// A Llama-shaped random model mixing the test models' formats, with a stub byte-level
/// tokenizer so `prima run` can use it too.
/// `mixes[il % 2]` gives layer il's q, k, v, o, gate, up, down formats; `head` the token
/// embedding's and output head's.
pub fn write_model(
    path: &Path,
    shape: ModelShape,
    n_layer: u64,
    mixes: [[GgmlType; 7]; 2],
    head: [GgmlType; 2],
) {
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let ModelShape {
        n_embd: e,
        n_ff: ff,
        n_vocab,
        n_head,
        n_head_kv,
    } = shape;
    let kv = e / n_head * n_head_kv;
    let mut w = GgufWriter::new();
    let u = |v: u64| Value::U32(v as u32);
    w.add("general.architecture", Value::String("llama".into()))
        .add("general.name", Value::String("gpu-test-llama".into()))
        .add("llama.context_length", u(2048))
        .add("llama.embedding_length", u(e))
        .add("llama.block_count", u(n_layer))
        .add("llama.feed_forward_length", u(ff))
        .add("llama.attention.head_count", u(n_head))
        .add("llama.attention.head_count_kv", u(n_head_kv))
        .add("llama.rope.dimension_count", u(e / n_head))
        .add("llama.rope.freq_base", Value::F32(10_000.0))
        .add("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    let mut tokens: Vec<Value> = (0..256).map(|b| Value::String(byte_token(b))).collect();
    tokens.extend((256..n_vocab - 1).map(|i| Value::String(format!("<filler_{i}>"))));
    tokens.push(Value::String("<|endoftext|>".into()));
    let mut types = vec![Value::I32(1); n_vocab as usize];
    types[n_vocab as usize - 1] = Value::I32(3);
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()))
        .add("tokenizer.ggml.pre", Value::String("llama-bpe".into()))
        .add("tokenizer.ggml.tokens", Value::Array(tokens))
        .add("tokenizer.ggml.token_type", Value::Array(types))
        .add(
            "tokenizer.ggml.merges",
            Value::Array(vec![Value::String("\u{0120} t".into())]),
        )
        .add("tokenizer.ggml.bos_token_id", u(n_vocab - 1))
        .add("tokenizer.ggml.eos_token_id", u(n_vocab - 1))
        .add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    let mut add = |name: &str, dims: &[u64], ty: GgmlType| {
        let data = if ty == GgmlType::F32 && dims.len() == 1 {
            (0..dims[0])
                .flat_map(|_| (1.0 + (rng.gen::<f32>() - 0.5) * 0.2).to_le_bytes())
                .collect()
        } else {
            random_weight(
                &mut rng,
                ty,
                dims[0] as usize,
                dims[1..].iter().product::<u64>() as usize,
            )
        };
        w.add_tensor(name, dims, ty, &data).unwrap();
    };
    use GgmlType as T;
    add("token_embd.weight", &[e, n_vocab], head[0]);
    for il in 0..n_layer {
        let m = mixes[il as usize % 2];
        let b = |s: &str| format!("blk.{il}.{s}");
        add(&b("attn_norm.weight"), &[e], T::F32);
        add(&b("attn_q.weight"), &[e, e], m[0]);
        add(&b("attn_k.weight"), &[e, kv], m[1]);
        add(&b("attn_v.weight"), &[e, kv], m[2]);
        add(&b("attn_output.weight"), &[e, e], m[3]);
        add(&b("ffn_norm.weight"), &[e], T::F32);
        add(&b("ffn_gate.weight"), &[e, ff], m[4]);
        add(&b("ffn_up.weight"), &[e, ff], m[5]);
        add(&b("ffn_down.weight"), &[ff, e], m[6]);
    }
    add("output_norm.weight", &[e], T::F32);
    add("output.weight", &[e, n_vocab], head[1]);
    w.write(path).unwrap();
}

/// GPT-2's printable stand-in for byte `b`.
fn byte_token(b: u32) -> String {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from_u32(b).unwrap().to_string();
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).unwrap().to_string()
}

/// Both backends on one model: the CPU decodes greedily; the GPU is fed the CPU's tokens
/// (so every step's logits are comparable) and also decodes greedily on its own.
pub struct Comparison {
    /// Largest |cpu − gpu| logit over the prompt and every fed step.
    pub max_diff: f32,
    /// Largest |logit| the CPU gave.
    pub max_logit: f32,
    /// Steps (prompt + fed tokens) whose top-1 agreed, and their number.
    pub top1_equal: usize,
    pub steps: usize,
    /// Steps where the CPU's top-2 gap exceeds [`GAP`] but the GPU picked another token.
    pub decided_mismatches: usize,
    /// How many of the greedy tokens agree before the first difference, free-running.
    pub greedy_equal: usize,
    pub n_greedy: usize,
    pub tpot_cpu_ms: f64,
    pub tpot_gpu_ms: f64,
}

impl Comparison {
    /// The target's promise kept: logits within its tolerance (bit for bit where exact),
    /// and no greedy token differs where the CPU's choice was clear.
    pub fn assert_within(&self, t: &Target, name: &str) {
        assert_eq!(self.decided_mismatches, 0, "{name}");
        assert!(
            self.max_diff <= t.tol(self.max_logit),
            "{name}: logits differ by {}",
            self.max_diff
        );
    }
}

/// The model at `path` on `cpu` and `gpu`: `prompt`, then `n_gen` steps fed with the CPU's
/// greedy tokens, and free-running greedy on each (TPOT measured there). `warm_up` first
/// runs the GPU once (weight upload, kernel compilation) so its TPOT is the steady one.
pub fn compare(
    name: &str,
    path: &Path,
    (cpu, gpu): (&BackendBox, &BackendBox),
    prompt: &[u32],
    n_gen: usize,
    warm_up: bool,
) -> Comparison {
    let model = Model::load(path).unwrap();
    // Greedy decoding; `feed` replaces the model's own choices. Returns every step's logits,
    // the tokens chosen and the TPOT.
    let run = |be: &BackendBox, feed: Option<&[u32]>| {
        let mut s = Session::new(&model, be, 256, 64).unwrap();
        let mut logits = vec![s.eval(prompt).unwrap().to_vec()];
        let mut tokens = vec![argmax(&logits[0]) as u32];
        let t0 = Instant::now();
        for i in 0..n_gen {
            let next = feed.map_or(tokens[i], |f| f[i]);
            let l = s.eval(&[next]).unwrap().to_vec();
            tokens.push(argmax(&l) as u32);
            logits.push(l);
        }
        let tpot = t0.elapsed().as_secs_f64() * 1000.0 / n_gen.max(1) as f64;
        (logits, tokens, tpot)
    };
    if warm_up {
        let _ = run(gpu, None);
    }
    let (lc, tc, tpot_cpu_ms) = run(cpu, None);
    let (_, tg, tpot_gpu_ms) = run(gpu, None);
    let (lf, tf, _) = run(gpu, Some(&tc));
    let mut c = Comparison {
        max_diff: 0.0,
        max_logit: 0.0,
        top1_equal: 0,
        steps: lc.len(),
        decided_mismatches: 0,
        greedy_equal: tc.iter().zip(&tg).take_while(|(a, b)| a == b).count(),
        n_greedy: tc.len(),
        tpot_cpu_ms,
        tpot_gpu_ms,
    };
    for (step, (a, b)) in lc.iter().zip(&lf).enumerate() {
        c.max_diff = c.max_diff.max(max_abs_diff(a, b));
        c.max_logit = c.max_logit.max(max_abs(a));
        if tc[step] == tf[step] {
            c.top1_equal += 1;
        } else {
            let gap = top2_gap(a);
            if gap > GAP {
                c.decided_mismatches += 1;
            }
            println!(
                "{name}: step {step}: cpu {} gpu {} (cpu top-2 gap {gap:.3})",
                tc[step], tf[step]
            );
        }
    }
    println!(
        "{name}: logits max |cpu-gpu| {:.2e} over {} steps (max |logit| {:.2}, {:.1e} of it); \
         top-1 equal {}/{}, {} differ where the cpu's top-2 gap > {GAP}; free-running greedy \
         tokens equal for the first {}/{}; TPOT cpu {:.2} ms, {} {:.2} ms",
        c.max_diff,
        c.steps,
        c.max_logit,
        c.max_diff / c.max_logit.max(1e-30),
        c.top1_equal,
        c.steps,
        c.decided_mismatches,
        c.greedy_equal,
        c.n_greedy,
        c.tpot_cpu_ms,
        gpu.name(),
        c.tpot_gpu_ms
    );
    c
}

/// A real model, `n_gen` greedy tokens after a short English prompt, held to the target's
/// promise ([`Comparison::assert_within`]).
pub fn real_model(t: &Target, name: &str, path: &Path, n_gen: usize) {
    let model = Model::load(path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let prompt = tok.encode("The capital of France is a city called", true, false);
    drop(model);
    let cpu = super::cpu();
    let c = compare(name, path, (&cpu, &t.backend), &prompt, n_gen, false);
    c.assert_within(t, name);
}
