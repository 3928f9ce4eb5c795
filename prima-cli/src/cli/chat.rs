//! `prima chat`: an interactive conversation in the terminal with a running server
//! (`prima serve` or the head of `prima apply`), streamed over its OpenAI API; with
//! `-m MODEL`, `prima run -i` on this device instead ([`local_alias`]). `/help`, `/reset`
//! and `/bye` are handled here, never sent to the model.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// `prima chat -m MODEL …` is `prima run -i -m MODEL …`: a chat with a model on this
/// device, no server needed (every `run` flag applies).
pub fn local_alias(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let is_model = |a: &std::ffi::OsString| {
        a.to_str().is_some_and(|s| {
            s == "-m" || s == "--model" || s.starts_with("--model=") || s.starts_with("-m=")
        })
    };
    if args.get(1).is_some_and(|a| a == "chat") && args[2..].iter().any(is_model) {
        args[1] = "run".into();
        args.insert(2, "-i".into());
    }
    args
}

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// A system message that opens the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Sampling temperature; 0 is greedy (default: the server's).
    #[arg(long)]
    temp: Option<f32>,
    /// Tokens per reply at most (default: until the model stops).
    #[arg(short = 'n', long)]
    max_tokens: Option<usize>,
    /// RNG seed, for replies that repeat.
    #[arg(long)]
    seed: Option<u64>,
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let base = args.url.trim_end_matches('/').to_string();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(5)))
        // Error statuses come back as responses, so their OpenAI error body can be read.
        .http_status_as_error(false)
        .build()
        .into();
    let model = model_name(&agent, &base)?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("connected to {base} ({model}); /help lists the commands, /bye or Ctrl-D ends");
    }

    let mut history: Vec<Value> = Vec::new();
    if let Some(system) = &args.system {
        history.push(json!({"role": "system", "content": system}));
    }
    let opening = history.len();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut stdout = std::io::stdout();
    loop {
        if interactive {
            write!(stdout, "> ")?;
            stdout.flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading standard input")?;
        let line = line.trim();
        match line {
            "" => continue,
            "/bye" | "/exit" | "/quit" => break,
            "/reset" => {
                history.truncate(opening);
                continue;
            }
            "/help" => {
                eprintln!("/help   this list\n/reset  forget the conversation (the system message stays)\n/bye    end (also /exit, /quit, Ctrl-D)");
                continue;
            }
            command if command.starts_with('/') => {
                eprintln!("unknown command {command}: /help lists them");
                continue;
            }
            _ => {}
        }
        history.push(json!({"role": "user", "content": line}));
        match reply(&agent, &base, &model, &history, &args, &mut stdout) {
            Ok(text) => history.push(json!({"role": "assistant", "content": text})),
            Err(e) => {
                // Keep the conversation as it was; the user may try again.
                history.pop();
                eprintln!("error: {e:#}");
            }
        }
    }
    Ok(())
}

/// Asks `/v1/models` what the server runs; a clear error if it cannot be reached.
fn model_name(agent: &ureq::Agent, base: &str) -> anyhow::Result<String> {
    let mut response = match agent.get(format!("{base}/v1/models")).call() {
        Ok(r) => r,
        Err(e) => bail!("cannot reach the server at {base}: {e} (start one with `prima serve`)"),
    };
    let status = response.status();
    if !status.is_success() {
        bail!("{base}/v1/models answered HTTP {status}: is this a Prima server?");
    }
    let models: Value = response
        .body_mut()
        .read_json()
        .with_context(|| format!("{base}/v1/models did not answer with JSON"))?;
    Ok(models["data"][0]["id"]
        .as_str()
        .unwrap_or("unknown model")
        .to_string())
}

/// Streams one reply to `out` and returns its text.
fn reply(
    agent: &ureq::Agent,
    base: &str,
    model: &str,
    history: &[Value],
    args: &ChatArgs,
    out: &mut impl Write,
) -> anyhow::Result<String> {
    let mut body = json!({"model": model, "messages": history, "stream": true});
    if let Some(t) = args.temp {
        body["temperature"] = json!(t);
    }
    if let Some(n) = args.max_tokens {
        body["max_tokens"] = json!(n);
    }
    if let Some(s) = args.seed {
        body["seed"] = json!(s);
    }
    let url = format!("{base}/v1/chat/completions");
    let mut response = match agent.post(&url).send_json(body) {
        Ok(r) => r,
        Err(e) => bail!("cannot reach the server at {base}: {e}"),
    };
    let status = response.status();
    if !status.is_success() {
        let detail: Value = response.body_mut().read_json().unwrap_or(Value::Null);
        let message = detail["error"]["message"].as_str().unwrap_or("no details");
        bail!("the server answered HTTP {status}: {message}");
    }
    let mut text = String::new();
    for line in BufReader::new(response.into_body().into_reader()).lines() {
        let line = line.context("reading the reply")?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).context("a reply chunk is not JSON")?;
        if let Some(message) = chunk["error"]["message"].as_str() {
            writeln!(out)?;
            bail!("{message}");
        }
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            out.write_all(piece.as_bytes())?;
            out.flush()?;
            text.push_str(piece);
        }
    }
    writeln!(out)?;
    Ok(text)
}
