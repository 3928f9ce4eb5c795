//! Halda on mixtures of experts: a layer's memory is all its experts, its per-token
//! compute and reads are the shared part plus the k selected experts, and the experts a
//! device cannot hold cost only their expected misses (k × expert bytes × (1 − hit rate)
//! per layer, the hottest kept resident). No timing: the latency model's terms only.

mod halda_support;

use std::path::PathBuf;

use halda_support::{devices, os_models, solver};
use prima_cluster::halda::{self, Lda, ModelProfile, PlanOptions, Scheduler};
use prima_cluster::profile::DeviceProfile;
use prima_core::gguf::{GgmlType, GgufWriter, Value};

/// A Qwen3-MoE-shaped sparse GGUF (index only; Q4_K weights, F32 norms and router).
struct Shape {
    tag: &'static str,
    n_layers: u64,
    n_embd: u64,
    n_head: u64,
    n_head_kv: u64,
    head_dim: u64,
    n_expert: u64,
    k: u64,
    n_ff_exp: u64,
    n_vocab: u64,
}

/// Qwen3-30B-A3B's shape: 48 layers, 128 experts of width 768, 8 per token.
const QWEN3_30B_A3B: Shape = Shape {
    tag: "qwen3-30b-a3b",
    n_layers: 48,
    n_embd: 2048,
    n_head: 32,
    n_head_kv: 4,
    head_dim: 128,
    n_expert: 128,
    k: 8,
    n_ff_exp: 768,
    n_vocab: 151_936,
};

fn write(s: &Shape) -> PathBuf {
    let mut w = GgufWriter::new();
    let u = |n: u64| Value::U32(n as u32);
    let a = |k: &str| format!("qwen3moe.{k}");
    w.add("general.architecture", Value::String("qwen3moe".into()))
        .add("general.name", Value::String(s.tag.into()))
        .add(&a("block_count"), u(s.n_layers))
        .add(&a("context_length"), u(4096))
        .add(&a("embedding_length"), u(s.n_embd))
        .add(&a("feed_forward_length"), u(s.n_ff_exp * s.k))
        .add(&a("expert_feed_forward_length"), u(s.n_ff_exp))
        .add(&a("expert_count"), u(s.n_expert))
        .add(&a("expert_used_count"), u(s.k))
        .add(&a("attention.head_count"), u(s.n_head))
        .add(&a("attention.head_count_kv"), u(s.n_head_kv))
        .add(&a("attention.key_length"), u(s.head_dim))
        .add(&a("attention.value_length"), u(s.head_dim));
    let (d, q, kv, ff, ne) = (
        s.n_embd,
        s.n_head * s.head_dim,
        s.n_head_kv * s.head_dim,
        s.n_ff_exp,
        s.n_expert,
    );
    let mut t = |name: &str, dims: &[u64], ty| {
        w.add_tensor_unallocated(name, dims, ty).unwrap();
    };
    t("token_embd.weight", &[d, s.n_vocab], GgmlType::Q4K);
    for il in 0..s.n_layers {
        let n = |x: &str| format!("blk.{il}.{x}");
        t(&n("attn_norm.weight"), &[d], GgmlType::F32);
        t(&n("attn_q.weight"), &[d, q], GgmlType::Q4K);
        t(&n("attn_k.weight"), &[d, kv], GgmlType::Q4K);
        t(&n("attn_v.weight"), &[d, kv], GgmlType::Q4K);
        t(&n("attn_q_norm.weight"), &[s.head_dim], GgmlType::F32);
        t(&n("attn_k_norm.weight"), &[s.head_dim], GgmlType::F32);
        t(&n("attn_output.weight"), &[q, d], GgmlType::Q4K);
        t(&n("ffn_norm.weight"), &[d], GgmlType::F32);
        t(&n("ffn_gate_inp.weight"), &[d, ne], GgmlType::F32);
        t(&n("ffn_gate_exps.weight"), &[d, ff, ne], GgmlType::Q4K);
        t(&n("ffn_up_exps.weight"), &[d, ff, ne], GgmlType::Q4K);
        t(&n("ffn_down_exps.weight"), &[ff, d, ne], GgmlType::Q4K);
    }
    t("output_norm.weight", &[d], GgmlType::F32);
    t("output.weight", &[d, s.n_vocab], GgmlType::Q4K);
    let dir = std::env::temp_dir().join(format!("prima-halda-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // One file per write: the tests of this process run in parallel on the same shapes.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{}-{n}.gguf", s.tag));
    w.write(&path).unwrap();
    path
}

fn profile(s: &Shape) -> ModelProfile {
    ModelProfile::open(&write(s)).unwrap()
}

/// Skewed use, as trained routers have it: expert e's share ∝ 0.9^e in every layer.
fn skewed(s: &Shape) -> Vec<Vec<f64>> {
    (0..s.n_layers)
        .map(|_| (0..s.n_expert).map(|e| 0.9f64.powi(e as i32)).collect())
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn a_moe_layer_holds_all_experts_and_a_token_reads_and_computes_k() {
    let s = &QWEN3_30B_A3B;
    let m = profile(s);
    let moe = m.moe.as_ref().expect("qwen3moe is a mixture of experts");
    assert_eq!((moe.n_expert, moe.n_expert_used), (128, 8));
    // One expert: gate, up and down of 2048 × 768 in Q4_K (144 bytes per 256 weights).
    let expert = 3.0 * (2048.0 * 768.0 / 256.0) * 144.0;
    assert_eq!(moe.expert_bytes, expert);
    // Memory: every expert; reads: the shared part and 8 of them.
    let shared = m.layer_bytes - 128.0 * expert;
    assert!(shared > 0.0 && shared < 0.05 * m.layer_bytes, "{shared}");
    assert!(close(m.layer_read_bytes(), shared + 8.0 * expert));
    // Compute: 2 FLOPs per weight of the shared matrices, 8/128 of the experts'.
    let q4k = m.layer_flops[prima_cluster::profile::QuantClass::Q4K.index()];
    let attn = 2.0 * (2048.0 * 4096.0 * 2.0 + 2.0 * 2048.0 * 512.0);
    let experts = 2.0 * 3.0 * 2048.0 * 768.0 * 128.0 * (8.0 / 128.0);
    assert!(close(q4k, attn + experts), "{q4k} vs {}", attn + experts);
    // About 3.3 B of 30.5 B parameters active, as the real model's.
    let total = m.total_bytes / (144.0 / 256.0);
    assert!((29e9..32e9).contains(&total), "{total}");
}

#[test]
fn the_hit_rate_of_the_hottest_experts_follows_the_routing_profile() {
    let s = &QWEN3_30B_A3B;
    let uniform = profile(s);
    let moe = uniform.moe.as_ref().unwrap();
    assert!(close(moe.hit_rate(32.0), 0.25));
    assert!(close(moe.hit_rate(128.0), 1.0));
    let skewed_profile = profile(s).with_routing(skewed(s)).unwrap();
    let hot = skewed_profile.moe.as_ref().unwrap();
    // 0.9^e normalised: the top 32 take 1 − 0.9^32 of the selections.
    let learned = (1.0 - 0.9f64.powi(32)) / (1.0 - 0.9f64.powi(128));
    assert!(close(hot.learned_hit_rate(32.0), learned));
    // Half of the next expert's share for half an expert.
    let half = learned + 0.5 * 0.9f64.powi(32) * (1.0 - 0.9) / (1.0 - 0.9f64.powi(128));
    assert!(close(hot.learned_hit_rate(32.5), half));
    // λ of the selections are not foreseen by the profile: uniform over the experts.
    let lambda = prima_cluster::halda::UNFORESEEN_ROUTING;
    let want = (1.0 - lambda) * learned + lambda * 0.25;
    assert!(close(hot.hit_rate(32.0), want), "{}", hot.hit_rate(32.0));
    // Misses: k × expert bytes × (1 − hit rate) per layer. Leaving out 96 experts of
    // each of 10 layers reads 8·(1 − 0.25) experts per layer when uniform.
    let eb = moe.expert_bytes;
    assert!(close(
        moe.miss_bytes(10.0, 10.0 * 96.0 * eb),
        10.0 * 8.0 * 0.75 * eb
    ));
    assert!(close(
        hot.miss_bytes(10.0, 10.0 * 96.0 * eb),
        10.0 * 8.0 * (1.0 - want) * eb
    ));
    assert_eq!(moe.miss_bytes(10.0, 0.0), 0.0);
    // Uniform misses are k/n of what is left out, whatever the amount.
    assert!(close(
        moe.miss_bytes(10.0, 123.0 * eb),
        123.0 * eb * moe.read_fraction()
    ));
}

#[test]
fn a_bad_routing_profile_is_an_error_naming_what_is_wrong() {
    let s = &QWEN3_30B_A3B;
    let err = |r: Vec<Vec<f64>>| profile(s).with_routing(r).unwrap_err().to_string();
    assert!(err(vec![vec![1.0; 128]; 47]).contains("47 layers given, the model has 48"));
    let mut short = vec![vec![1.0; 128]; 48];
    short[3] = vec![1.0; 64];
    assert!(err(short).contains("layer 3: 64 experts given, the model has 128"));
    let mut negative = vec![vec![1.0; 128]; 48];
    negative[5][7] = -1.0;
    assert!(err(negative).contains("layer 5, expert 7"));
    let mut zero = vec![vec![1.0; 128]; 48];
    zero[2] = vec![0.0; 128];
    assert!(err(zero).contains("layer 2: no expert is used"));
    let json = profile(s)
        .with_routing_json("{\"experts\": 3}")
        .unwrap_err();
    assert!(json.to_string().contains("expert-use profile"), "{json}");
    let named = format!("{{\"expert_use\": {:?}}}", skewed(s));
    assert!(profile(s).with_routing_json(&named).is_ok());
    // A dense model has no routing to profile.
    let dense = ModelProfile::open(&halda_support::model_path("llama3-8b-q4_k")).unwrap();
    assert!(dense.moe.is_none());
    assert_eq!(dense.layer_read_bytes(), dense.layer_bytes);
    let e = dense.with_routing(vec![]).unwrap_err().to_string();
    assert!(e.contains("not a mixture of experts"), "{e}");
}

/// One device, all layers: how much it reads from disk per token.
fn one_device_reads(model: &ModelProfile, device: &DeviceProfile) -> (f64, f64) {
    let opts = PlanOptions::default();
    let lda = Lda::new(model, &[device], &[], &os_models(), &opts).unwrap();
    let p = lda.predict(&[model.n_layers], &[0]);
    (p.devices[0].reload_bytes, p.total_s)
}

#[test]
fn a_device_short_of_memory_reads_only_the_selected_experts_it_misses() {
    let s = &QWEN3_30B_A3B;
    let uniform = profile(s);
    // D3 of the paper (Linux, 9.7 GiB available) under an 18 GB model.
    let d3 = devices("d1-d6", &["D3"]).remove(0);
    let (uniform_reads, uniform_t) = one_device_reads(&uniform, &d3);
    let opts = PlanOptions::default();
    let lda = Lda::new(&uniform, &[&d3], &[], &os_models(), &opts).unwrap();
    let dense_like = {
        let d = &lda.devices[0];
        d.behaviour.reload_bytes(48.0, 0.0, &d.mem, d.budget)
    };
    // What it cannot hold is experts: a token reads k/n of those bytes, not all.
    assert!(dense_like > 5e9, "{dense_like}");
    assert!(
        close(uniform_reads, dense_like * 8.0 / 128.0),
        "{uniform_reads} vs {dense_like}"
    );
    // Skewed routing keeps the hot experts: fewer misses, a faster token.
    let hot = profile(s).with_routing(skewed(s)).unwrap();
    let (hot_reads, hot_t) = one_device_reads(&hot, &d3);
    assert!(
        hot_reads < 0.5 * uniform_reads,
        "{hot_reads} vs {uniform_reads}"
    );
    assert!(hot_t < uniform_t);
    // The ILP's linear terms price a byte left out at k/n of a disk read.
    let d = &lda.devices[0];
    assert!(close(d.s_reload, d.s_disk * 128.0 / 8.0));
}

#[test]
fn halda_plans_a_moe_larger_than_any_device_and_predicts_less_for_skewed_routing() {
    let s = &QWEN3_30B_A3B;
    let d1_d4 = devices("d1-d6", &["D1", "D2", "D3", "D4"]);
    let opts = PlanOptions::default();
    let plan = |m: &ModelProfile| {
        halda::plan(
            m,
            &d1_d4,
            Scheduler::Halda,
            Some(&solver()),
            &os_models(),
            &opts,
        )
        .unwrap()
    };
    let uniform = plan(&profile(s));
    let hot = plan(&profile(s).with_routing(skewed(s)).unwrap());
    let layers: u32 = uniform.devices.iter().map(|d| d.w).sum::<u32>() * uniform.k;
    assert_eq!(layers, 48);
    assert!(uniform.predicted_tpot_ms.is_finite() && uniform.predicted_tpot_ms > 0.0);
    assert!(
        hot.predicted_tpot_ms <= uniform.predicted_tpot_ms,
        "{} vs {}",
        hot.predicted_tpot_ms,
        uniform.predicted_tpot_ms
    );
}
