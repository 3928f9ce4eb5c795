//! `prima serve --draft` over HTTP: the F16 SmolLM2 served with its Q4_1 as the draft
//! gives the greedy text it gives without a draft, alone and with `--parallel` slots
//! drafting together, reuses the previous request's cache, and counts drafted and
//! accepted tokens in `/metrics` and each reply's timings.

mod common;
mod server_support;

use serde_json::{json, Value};
use server_support::Server;

fn request(prompt: &str) -> Value {
    json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": true})
}

/// The replies to a first prompt and to one that continues it (prefix reuse).
fn replies(server: &Server) -> Vec<Value> {
    let first = "The capital of France is";
    let (status, a) = server.post_json("/v1/completions", &request(first));
    assert_eq!(status, 200, "{a}");
    let continued = format!(
        "{first}{} And the capital of Italy is",
        a["choices"][0]["text"].as_str().unwrap()
    );
    let (status, b) = server.post_json("/v1/completions", &request(&continued));
    assert_eq!(status, 200, "{b}");
    vec![a, b]
}

fn text_of(reply: &Value) -> &str {
    reply["choices"][0]["text"].as_str().unwrap()
}

#[test]
fn a_served_draft_gives_the_text_without_one_and_counts_its_tokens() {
    let Some((target, draft)) = common::draft_pair() else {
        return;
    };
    let draft = draft.to_string_lossy().into_owned();

    let plain = replies(&Server::start(&target, &["-c", "512"]));
    let server = Server::start(&target, &["-c", "512", "--draft", &draft]);
    let drafted = replies(&server);
    for (p, d) in plain.iter().zip(&drafted) {
        assert_eq!(text_of(d), text_of(p), "greedy text with a draft differs");
        assert_eq!(d["usage"]["completion_tokens"], 40, "{d}");
    }
    let proposed = server.metric("prima_draft_tokens_total");
    let accepted = server.metric("prima_draft_accepted_total");
    assert!(
        proposed > 0.0 && accepted > 0.0,
        "drafted {proposed}, accepted {accepted}"
    );
    assert!(accepted <= proposed);
    // The second request continued the first: its prompt came from the cache.
    let cached = server.metric("prima_prompt_tokens_cached_total");
    assert!(cached > 0.0, "no prompt tokens were reused");
}

#[test]
fn concurrent_requests_with_a_draft_get_the_text_each_gets_alone() {
    let Some((target, draft)) = common::draft_pair() else {
        return;
    };
    let draft = draft.to_string_lossy().into_owned();
    let prompts = [
        "The capital of France is",
        "Water boils at a temperature of",
        "A short poem about the sea:\n",
    ];
    let plain = Server::start(&target, &["-c", "512"]);
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (status, reply) = plain.post_json("/v1/completions", &request(p));
            assert_eq!(status, 200, "{reply}");
            text_of(&reply).to_string()
        })
        .collect();
    drop(plain);

    let args = ["-c", "512", "--parallel", "3", "--draft", &draft];
    let server = Server::start(&target, &args);
    let together: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let url = format!("{}/v1/completions", server.url);
                scope.spawn(move || {
                    let mut response = server_support::post(&url, &request(p).to_string()).unwrap();
                    assert_eq!(response.status(), 200);
                    response.body_mut().read_json::<Value>().unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (reply, want) in together.iter().zip(&alone) {
        assert_eq!(
            text_of(reply),
            want,
            "a batched drafted reply differs from alone"
        );
        let timings = &reply["timings"];
        let (drafted, accepted) = (&timings["draft_n"], &timings["draft_n_accepted"]);
        assert!(
            drafted.as_u64() > Some(0) && accepted.as_u64() <= drafted.as_u64(),
            "{timings}"
        );
    }
    assert_eq!(server.metric("prima_slots"), 3.0);
    assert!(server.metric("prima_draft_accepted_total") > 0.0);
    let steps = server.metric("prima_batch_sequences_count");
    let sequences = server.metric("prima_batch_sequences_sum");
    assert!(sequences > steps, "{sequences} sequences in {steps} steps");
}

/// `prima apply` serving a ring of three with the manifest's draft model, two slots and
/// two micro-batches in flight: the reply is the greedy text one device generates
/// without a draft.
#[test]
fn apply_serves_a_ring_with_the_manifests_draft_model() {
    let Some((target, draft)) = common::draft_pair() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("prima-serve-draft-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("cluster.toml");
    let local = |name: &str, head: bool| {
        format!("[[device]]\nname = \"{name}\"\nhead = {head}\nlocal = true\nthreads = 1\n\n")
    };
    std::fs::write(
        &manifest,
        format!(
            "[model]\npath = {target:?}\ndraft = {draft:?}\ndraft_max = 4\n\n{}{}{}\
             [policy]\nscheduler = \"manual\"\nwindows = [10, 10, 10]\nctx = 256\n\
             micro_batches = 2\n\n\
             [server]\nlisten = \"127.0.0.1:0\"\nparallel = 2\n",
            local("desktop", true),
            local("laptop", false),
            local("tablet", false),
        ),
    )
    .unwrap();
    let prompt = "The three primary colours are";
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_prima"));
    cmd.arg("apply").arg(&manifest);
    let mut server = Server::spawn(cmd);
    // Two requests at once: both slots draft, and the ring verifies both in each trip.
    let replies: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = [prompt, "The capital of France is"]
            .into_iter()
            .map(|p| {
                let url = format!("{}/v1/completions", server.url);
                scope.spawn(move || {
                    let mut response = server_support::post(&url, &request(p).to_string()).unwrap();
                    assert_eq!(response.status(), 200);
                    response.body_mut().read_json::<Value>().unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let reply = &replies[0];
    assert!(server.metric("prima_draft_tokens_total") > 0.0);
    let (exit, log) = server.interrupt();
    assert!(exit.success(), "{}", log.join("\n"));

    let single = std::process::Command::new(env!("CARGO_BIN_EXE_prima"))
        .args([
            "run", "-p", prompt, "-n", "40", "--temp", "0", "-t", "1", "-c", "256",
        ])
        .arg("--ignore-eos")
        .arg("-m")
        .arg(&target)
        .output()
        .unwrap();
    assert!(single.status.success());
    assert_eq!(
        text_of(reply),
        String::from_utf8_lossy(&single.stdout).trim_end_matches('\n'),
        "the served ring with a draft generates what one device generates"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
