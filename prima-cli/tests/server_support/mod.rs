//! A `prima serve` process for the server tests, and small HTTP helpers around it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// SmolLM2, or `None` (with a note) where models are optional and it is absent.
pub fn smollm2() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("PRIMA_REQUIRE_MODELS").is_some() {
        panic!(
            "{} is missing (run `cargo xtask fetch-models`)",
            path.display()
        );
    }
    eprintln!("note: skipping, {} is absent", path.display());
    None
}

/// A running `prima serve`, killed when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// Everything the server printed on stderr so far.
    log: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `prima serve` on a free loopback port with `extra` arguments.
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "-t", "1", "-m"])
            .arg(model)
            .args(extra);
        Server::spawn(cmd)
    }

    /// Runs `cmd` (a `prima` command that serves, e.g. `prima apply`) and waits for the
    /// address it prints.
    pub fn spawn(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start prima serve");
        let stderr = child.stderr.take().unwrap();
        let (addr_tx, addr_rx) = mpsc::channel();
        let (log_tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("serve: listening on ") {
                    let url = rest.split(' ').next().unwrap_or_default().to_string();
                    let _ = addr_tx.send(url);
                }
                let _ = log_tx.send(line);
            }
        });
        let url = match addr_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let lines: Vec<String> = log.try_iter().collect();
                panic!("prima serve printed no address:\n{}", lines.join("\n"));
            }
        };
        Server { child, url, log }
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        response(agent().get(format!("{}{path}", self.url)).call())
    }

    /// POSTs `body` as it is (it may be malformed on purpose).
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        response(post(&format!("{}{path}", self.url), body))
    }

    pub fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.post(path, &body.to_string());
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("HTTP {status} body is not JSON ({e}): {text}"));
        (status, value)
    }

    /// The value of a Prometheus sample whose line starts with `series` (0 if absent).
    pub fn metric(&self, series: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                (name == series).then(|| value.parse::<f64>().ok())?
            })
            .unwrap_or(0.0)
    }

    /// Polls `/metrics` until `series` reaches `at_least` (bounded: 120 s).
    pub fn wait_for_metric(&self, series: &str, at_least: f64) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v = self.metric(series);
            if v >= at_least || Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `/metrics` until `series` falls to `at_most` (bounded: 120 s).
    pub fn wait_for_metric_at_most(&self, series: &str, at_most: f64) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v = self.metric(series);
            if v <= at_most || Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything printed on stderr since the last call.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.log.try_iter().collect()
    }

    /// Sends SIGINT (Ctrl-C), waits for the process to exit (bounded: 60 s), and returns
    /// its status and the rest of its stderr.
    pub fn interrupt(&mut self) -> (std::process::ExitStatus, Vec<String>) {
        let kill = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut lines = Vec::new();
                // Until the reader thread has seen the end of the pipe.
                while let Ok(line) = self.log.recv_timeout(Duration::from_secs(10)) {
                    lines.push(line);
                }
                return (status, lines);
            }
            assert!(
                Instant::now() < deadline,
                "prima serve did not stop on SIGINT"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client that returns error statuses as responses.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// POSTs a JSON `body` to `url`.
pub fn post(url: &str, body: &str) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body)
}

/// The response's body as a reader (for streams read piece by piece).
pub fn reader(r: ureq::http::Response<ureq::Body>) -> impl std::io::Read {
    assert!(r.status().is_success(), "HTTP {}", r.status());
    r.into_body().into_reader()
}

fn response(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, String) {
    match r {
        Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap()),
        Err(e) => panic!("request failed: {e}"),
    }
}

/// The JSON payloads of an SSE body, and whether it ended with `data: [DONE]`.
pub fn sse_events(body: &str) -> (Vec<Value>, bool) {
    let mut events = Vec::new();
    let mut done = false;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            assert!(line.is_empty(), "unexpected SSE line: {line:?}");
            continue;
        };
        assert!(!done, "data after [DONE]: {data}");
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap());
        }
    }
    (events, done)
}
