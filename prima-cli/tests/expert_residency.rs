//! Experts as the unit of residency (`prp/expert_cache.rs`): a MoE model whose experts do
//! not all fit keeps its shared parts and hottest experts resident and streams the others
//! per use — and computes exactly what it computes with everything resident.

mod common;

use std::ops::Range;

use common::{cpu_backend, derived_models, model_or_skip};
use prima_cluster::prp::alone::LocalSession;
use prima_cluster::prp::expert_cache::{ExpertCache, ExpertHints};
use prima_cluster::prp::protocol::{ReleaseMethod, ReleasePolicy};
use prima_core::generate::Forward;
use prima_core::model::{Model, Session};
use prima_core::tokenizer::Tokenizer;

const MODELS: [&str; 2] = [
    "tiny-qwen3moe-16x4-q4_k_m.gguf",
    "tiny-qwen3moe-8x2-f32.gguf",
];

/// Greedy tokens and every step's logits, bit for bit.
fn greedy<F: Forward>(f: &mut F, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>)
where
    F::Error: std::fmt::Debug,
{
    let argmax = |l: &[f32]| {
        (0..l.len())
            .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
            .unwrap() as u32
    };
    let mut logits = f.eval(prompt).unwrap().to_vec();
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = argmax(&logits);
        tokens.push(t);
        all.push(logits);
        logits = f.eval(&[t]).unwrap().to_vec();
    }
    (tokens, all)
}

fn hints(release: ReleasePolicy) -> ExpertHints {
    ExpertHints {
        prefetch: true,
        release,
        method: ReleaseMethod::Pageout,
        predict: true,
        persist: false,
    }
}

/// What every token reads whatever its experts: output head and each layer's shared part.
fn fixed_bytes(model: &Model) -> u64 {
    let n = model.hparams().n_layers;
    model.read_whole_bytes() + (0..n).map(|il| model.layer_shared_bytes(il)).sum::<u64>()
}

#[test]
fn streamed_experts_give_the_same_logits_and_count_hits_and_misses() {
    for file in MODELS {
        let Some(path) = model_or_skip(derived_models().join(file)) else {
            continue;
        };
        let model = Model::load(&path).unwrap();
        let backend = cpu_backend(2);
        let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
        let prompt = tok.encode("Experts are kept, streamed and released.", true, true);
        let (n_ctx, n_batch) = (128, 4);
        let mut plain = Session::new(&model, &backend.backend, n_ctx, n_batch).unwrap();
        let expected = greedy(&mut plain, &prompt, 10);

        let shape = model.experts().unwrap();
        let per_layer = model.expert_bytes(0);
        let min_bytes = (0..model.hparams().n_layers)
            .map(|il| model.expert_bytes(il))
            .min()
            .unwrap();
        let base = fixed_bytes(&model) + ExpertCache::room(&model);
        // No expert resident, then about a quarter of them.
        let quarter = model.hparams().n_layers as u64 * shape.n_expert as u64 / 4 * per_layer;
        for budget in [base, base + quarter] {
            for release in [ReleasePolicy::Mru, ReleasePolicy::None] {
                let cache = ExpertCache::plan_alone(&model, budget, None, hints(release))
                    .expect("the shared parts fit, the experts do not");
                cache.warm();
                let session = Session::new(&model, &backend.backend, n_ctx, n_batch).unwrap();
                let mut local = LocalSession::with_experts(session, cache);
                assert!(
                    greedy(&mut local, &prompt, 10) == expected,
                    "{file}, budget {budget}, {release:?}: the logits differ"
                );
                let s = local.expert_stats().unwrap();
                assert!(s.misses > 0, "{file}: {s:?}");
                assert!(s.streamed_bytes >= s.misses * min_bytes, "{file}: {s:?}");
                if budget == base {
                    assert_eq!((s.hits, s.resident_experts), (0, 0), "{file}: {s:?}");
                } else {
                    assert!(s.hits > 0 && s.resident_experts > 0, "{file}: {s:?}");
                }
            }
        }
    }
}

#[test]
fn plans_keep_the_shared_parts_and_fall_back_to_layers_when_they_do_not_fit() {
    let Some(path) = model_or_skip(derived_models().join(MODELS[1])) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let total = model.read_whole_bytes()
        + (0..model.hparams().n_layers)
            .map(|il| model.layer_bytes(il))
            .sum::<u64>();
    let base = fixed_bytes(&model) + ExpertCache::room(&model);
    let h = hints(ReleasePolicy::Mru);
    // Everything fits: nothing to stream. The shared parts do not: layers are streamed.
    assert!(ExpertCache::plan_alone(&model, total, None, h).is_none());
    assert!(ExpertCache::plan_alone(&model, base - 1, None, h).is_none());
    // A dense model has no experts to plan.
    if let Some(dense) = model_or_skip(derived_models().join("tiny-qwen3-f32.gguf")) {
        let dense = Model::load(&dense).unwrap();
        assert!(ExpertCache::plan_alone(&dense, 1, None, h).is_none());
    }
    // Uniform before any count: layers whose experts are the same size keep as many
    // (±1); smaller experts first (more hits per byte).
    let ne = model.experts().unwrap().n_expert;
    let per = model.expert_bytes(0);
    let n_layers = model.hparams().n_layers;
    let cache = ExpertCache::plan_alone(&model, base + 5 * per, None, h).unwrap();
    let kept = |il: usize| (0..ne).filter(|&e| cache.is_resident(il, e)).count();
    for a in 0..n_layers {
        for b in 0..n_layers {
            let (sa, sb) = (model.expert_bytes(a), model.expert_bytes(b));
            if sa == sb {
                assert!(kept(a).abs_diff(kept(b)) <= 1, "layers {a}, {b}");
            } else if sa < sb {
                assert!(kept(a) >= kept(b), "layers {a}, {b}");
            }
        }
    }
    // With counts, the hottest experts are the resident ones.
    let counts: Vec<Vec<u64>> = (0..n_layers)
        .map(|il| {
            (0..ne as u64)
                .map(|e| if e == il as u64 { 100 } else { e })
                .collect()
        })
        .collect();
    let cache =
        ExpertCache::plan_alone(&model, base + n_layers as u64 * per, Some(&counts), h).unwrap();
    for il in 0..n_layers {
        assert!(cache.is_resident(il, il), "layer {il}");
    }
}

/// What a release of `r` drops: the pages it covers whole (`GgufFile::advise_pages`).
fn released(r: &Range<u64>, page: u64) -> Range<u64> {
    r.start.div_ceil(page) * page..(r.end / page * page).max(r.start.div_ceil(page) * page)
}

#[test]
fn releasing_a_streamed_expert_never_drops_a_page_a_resident_neighbour_shares() {
    let Some(path) = model_or_skip(derived_models().join(MODELS[0])) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let ne = model.experts().unwrap().n_expert;
    let per = model.expert_bytes(0);
    let base = fixed_bytes(&model) + ExpertCache::room(&model);
    let cache =
        ExpertCache::plan_alone(&model, base + 9 * per, None, hints(ReleasePolicy::Mru)).unwrap();
    let page = 4096;
    for il in 0..model.hparams().n_layers {
        // Slabs of one tensor follow each other: expert e's ends where e + 1's starts.
        for e in 1..ne {
            let (a, b) = (model.expert_ranges(il, e - 1), model.expert_ranges(il, e));
            for (ra, rb) in a.iter().zip(&b) {
                assert_eq!(ra.end, rb.start);
            }
        }
        let kept: Vec<Range<u64>> = (0..ne)
            .filter(|&e| cache.is_resident(il, e))
            .flat_map(|e| model.expert_ranges(il, e))
            .chain(
                model
                    .layer_shared_tensors(il)
                    .map(|t| t.offset..t.offset + t.n_bytes),
            )
            .collect();
        for e in (0..ne).filter(|&e| !cache.is_resident(il, e)) {
            for r in model.expert_ranges(il, e) {
                let gone = released(&r, page);
                assert!(gone.start >= r.start && gone.end <= r.end);
                for k in &kept {
                    assert!(
                        gone.end <= k.start || k.end <= gone.start,
                        "layer {il} expert {e}: {gone:?} overlaps resident {k:?}"
                    );
                }
            }
        }
    }
}

fn prima_run(model: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["run", "-t", "1", "--temp", "0", "-n", "12", "-c", "256"])
        .args(["-p", "The experts of a ring node are streamed", "-m"])
        .arg(model)
        .arg("--key-file")
        .arg(&common::test_key().0)
        .args(args)
        .output()
        .expect("run prima")
}

/// A ring head and node whose budgets hold their layers' shared parts but few experts
/// stream experts, print the same tokens as one device with everything resident, and report
/// their caches per device (`-v`, `--stats-json`).
#[test]
fn ring_devices_stream_experts_and_report_their_cache() {
    let Some(path) = model_or_skip(derived_models().join(MODELS[1])) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let n = model.hparams().n_layers;
    let (head_layers, node_layers) = (n / 2, n - n / 2);
    let shared: u64 = (head_layers..n)
        .map(|il| model.layer_shared_bytes(il))
        .sum();
    let budget = shared + ExpertCache::room(&model) + 2 * model.expert_bytes(n - 1);
    // The head's window too: its layers' shared parts and two experts.
    let head_shared: u64 = (0..head_layers)
        .map(|il| model.layer_shared_bytes(il))
        .sum();
    let head_budget =
        (head_shared + ExpertCache::room(&model) + 2 * model.expert_bytes(0)).to_string();
    let node = common::Node::start_with(&path, &["--mem-budget", &budget.to_string()]);
    let single = prima_run(&path, &["--mem-budget", "none"]);
    assert!(single.status.success());
    let stats =
        std::env::temp_dir().join(format!("prima-expert-stats-{}.json", std::process::id()));
    let windows = format!("{head_layers},{node_layers}");
    let stats_arg = stats.to_string_lossy().into_owned();
    let ringed = prima_run(
        &path,
        &[
            "--ring",
            &node.addr,
            "--windows",
            &windows,
            "--mem-budget",
            &head_budget,
            "-v",
            "--stats-json",
            &stats_arg,
        ],
    );
    let stderr = String::from_utf8_lossy(&ringed.stderr);
    assert!(ringed.status.success(), "{stderr}");
    assert_eq!(ringed.stdout, single.stdout, "{stderr}");
    assert!(stderr.contains("expert hit"), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let _ = std::fs::remove_file(&stats);
    let devices = json["devices"].as_array().unwrap();
    let sum = |d: &serde_json::Value, key: &str| -> u64 {
        d["passes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[key].as_u64().unwrap_or(0))
            .sum()
    };
    // The head and the node both stream experts and count them.
    for device in &devices[..2] {
        let (hits, misses) = (sum(device, "expert_hits"), sum(device, "expert_misses"));
        assert!(misses > 0 && hits > 0, "{hits} hits, {misses} misses");
        assert!(sum(device, "expert_streamed_bytes") > 0);
    }
    assert!(stderr.contains("head: memory:"), "{stderr}");
}

/// Routes `rows` rows of layer `il` to expert `e` alone.
fn route(cache: &ExpertCache<'_>, il: usize, e: usize, rows: usize) {
    use prima_core::model::{ExpertPolicy, Routing};
    let ne = cache.uses().n_expert();
    let start: Vec<usize> = (0..=ne).map(|i| if i > e { rows } else { 0 }).collect();
    cache.routed(il, Routing::from_starts(&start, &[]));
    cache.computed(il, e);
}

#[test]
fn the_hot_set_follows_the_counts_with_hysteresis() {
    let Some(path) = model_or_skip(derived_models().join(MODELS[1])) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let n = model.hparams().n_layers;
    let base = fixed_bytes(&model) + ExpertCache::room(&model);
    // One expert per layer: expert 0 while nothing is counted.
    let budget = base + n as u64 * model.expert_bytes(0);
    let cache = ExpertCache::plan_alone(&model, budget, None, hints(ReleasePolicy::Mru)).unwrap();
    assert!((0..n).all(|il| cache.is_resident(il, 0)));
    // Expert 5 takes every layer's rows: it replaces expert 0.
    for il in 0..n {
        route(&cache, il, 5, 600);
    }
    cache.replan_now();
    assert!((0..n).all(|il| cache.is_resident(il, 5) && !cache.is_resident(il, 0)));
    let s = cache.stats();
    assert_eq!((s.resident_experts, s.misses), (n as u64, n as u64));
    assert_eq!(cache.uses().layer(0)[5], 600);
    // Expert 6, used a little more (under 1.25×), does not displace it ...
    for il in 0..n {
        route(&cache, il, 6, 700);
    }
    cache.replan_now();
    assert!((0..n).all(|il| cache.is_resident(il, 5) && !cache.is_resident(il, 6)));
    // ... used twice as much, it does.
    for il in 0..n {
        route(&cache, il, 6, 700);
    }
    cache.replan_now();
    assert!((0..n).all(|il| cache.is_resident(il, 6) && !cache.is_resident(il, 5)));
    assert_eq!(cache.stats().resident_experts, n as u64);
}

/// The use counts of a run are saved when it ends and give the next run its first hot
/// set; a file that does not parse is a warning naming it, and is written anew.
#[test]
fn use_counts_persist_between_runs_and_a_corrupt_file_is_only_a_warning() {
    let Some(path) = model_or_skip(derived_models().join(MODELS[1])) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let shape = model.experts().unwrap();
    let (n_layers, n_expert) = (model.hparams().n_layers, shape.n_expert);
    let budget = fixed_bytes(&model) + ExpertCache::room(&model) + 2 * model.expert_bytes(0);
    let dir = std::env::temp_dir().join(format!("prima-expert-use-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(["run", "-t", "1", "--temp", "0", "-n", "8", "-c", "128"])
            .args(["-p", "Counts are kept between runs", "-m"])
            .arg(&path)
            .args(["--mem-budget", &budget.to_string()])
            .env("PRIMA_EXPERT_USE_DIR", &dir)
            .output()
            .expect("run prima");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        (out.stdout, stderr)
    };
    // Per layer, the rows routed, each to k experts: the same in every layer.
    let totals = || -> (std::path::PathBuf, Vec<u64>) {
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
        let layers = json["expert_use"].as_array().unwrap();
        assert_eq!(layers.len(), n_layers);
        let totals = layers
            .iter()
            .map(|l| {
                let l = l.as_array().unwrap();
                assert_eq!(l.len(), n_expert);
                l.iter().map(|c| c.as_u64().unwrap()).sum::<u64>()
            })
            .collect();
        (files[0].clone(), totals)
    };

    let (first, stderr) = run();
    assert!(stderr.contains("hottest first"), "{stderr}");
    let (file, once) = totals();
    assert!(
        once[0] > 0 && once.iter().all(|&t| t == once[0]),
        "{once:?}"
    );
    assert_eq!(once[0] % shape.n_expert_used as u64, 0);

    // The second run starts from the first's counts and adds its own.
    let (second, stderr) = run();
    assert_eq!(second, first, "{stderr}");
    assert!(stderr.contains("earlier runs' counts"), "{stderr}");
    let (_, twice) = totals();
    assert!(twice.iter().all(|&t| t == 2 * once[0]), "{twice:?}");

    std::fs::write(&file, "{\"expert_use\": [[1, 2]").unwrap();
    let (third, stderr) = run();
    assert_eq!(third, first, "{stderr}");
    assert!(stderr.contains("warning: expert use file"), "{stderr}");
    assert!(stderr.contains(&file.display().to_string()), "{stderr}");
    assert!(stderr.contains("hottest first"), "{stderr}");
    let (_, again) = totals();
    assert_eq!(again, once);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A prompt's streamed experts read in bulk, with or without waiting for the reads, or
/// one by one: the same tokens.
#[test]
fn bulk_reads_of_a_prompt_give_the_same_tokens() {
    let Some(path) = model_or_skip(derived_models().join(MODELS[0])) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let budget = fixed_bytes(&model) + ExpertCache::room(&model) + 2 * model.expert_bytes(0);
    let run = |mode: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(["run", "-t", "1", "--temp", "0", "-n", "6", "-c", "128"])
            .args([
                "-p",
                "A prompt of more than a few rows reads its experts in bulk",
                "-m",
            ])
            .arg(&path)
            .args(["--mem-budget", &budget.to_string()])
            .env("PRIMA_EXPERT_USE_DIR", "off")
            .env("PRIMA_EXPERT_BULK", mode)
            .output()
            .expect("run prima");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("misses"), "{stderr}");
        out.stdout
    };
    let read = run("read");
    assert_eq!(run("wait"), read);
    assert_eq!(run("off"), read);
}
