//! The web page at `/`, driven in headless Chromium over chromedriver (WebDriver, with
//! `fantoccini`): a prompt is sent and its reply seen streaming, then stopped; the page
//! loads nothing from outside the host and its weight is measured; it fits a phone's
//! width; a three-device ring shows its three devices, one marked lost after its node is
//! killed and back after it restarts. Screenshots (PNG) go to `target/web-screenshots/`
//! (`PRIMA_WEB_SCREENSHOTS` moves them); each test prints where.
//!
//! `#[ignore]`d: they need `chromium` and `chromium-driver`, which `cargo xtask test`
//! installs where it can (as root on Debian) before running them with `--ignored`.

mod common;
mod server_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use server_support::{smollm2, Server};

/// How long a condition on the page may take to come true.
const PATIENCE: Duration = Duration::from_secs(120);

/// chromedriver on a free port, stopped when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Driver {
        let port = free_port();
        let child = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver (apt-get install chromium-driver)");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// A headless Chromium session, `width` × `height` CSS pixels.
    async fn browser(&self, width: u32, height: u32) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium(),
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                    format!("--window-size={width},{height}"),
                ],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a chromium session from chromedriver")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chromedriver() -> PathBuf {
    which(&["chromedriver"])
        .expect("chromedriver is not installed (apt-get install chromium-driver)")
}

fn chromium() -> String {
    which(&["chromium", "chromium-browser", "google-chrome"])
        .expect("chromium is not installed (apt-get install chromium)")
        .display()
        .to_string()
}

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn screenshot_dir() -> PathBuf {
    let dir = match std::env::var_os("PRIMA_WEB_SCREENSHOTS") {
        Some(d) => PathBuf::from(d),
        None => common::workspace_root().join("target/web-screenshots"),
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(page: &Client, name: &str) {
    let png = page.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "{name} is not a PNG");
    let path = screenshot_dir().join(name);
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

/// Evaluates `expr` in the page.
async fn eval(page: &Client, expr: &str) -> Value {
    page.execute(&format!("return ({expr});"), vec![])
        .await
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
}

/// Polls `expr` in the page until it is truthy; returns its value.
async fn wait_for(page: &Client, expr: &str, what: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = eval(page, expr).await;
        let truthy = match &v {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Number(n) => n.as_f64() != Some(0.0),
            Value::String(s) => !s.is_empty(),
            _ => true,
        };
        if truthy {
            return v;
        }
        if Instant::now() > deadline {
            let html = eval(page, "document.body.innerText").await;
            panic!("the page never showed {what} ({expr}); it shows:\n{html}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Types `text` into the prompt with `max_tokens` and sends it.
async fn send(page: &Client, text: &str, max_tokens: usize) {
    eval(
        page,
        &format!("(document.getElementById('max_tokens').value = {max_tokens}, true)"),
    )
    .await;
    let prompt = page.find(Locator::Id("prompt")).await.unwrap();
    prompt.send_keys(text).await.unwrap();
    page.find(Locator::Id("send"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// The last reply's state ("streaming", "done", "stopped", "failed").
const LAST_REPLY: &str = "document.querySelector('#messages .assistant:last-child')";

async fn reply_done(page: &Client) -> String {
    let state = wait_for(
        page,
        &format!("{LAST_REPLY} && {LAST_REPLY}.dataset.state !== 'streaming' && {LAST_REPLY}.dataset.state"),
        "a finished reply",
    )
    .await;
    state.as_str().unwrap_or_default().to_string()
}

/// Skips (with a note) where the browser is missing, unless `PRIMA_REQUIRE_BROWSER` is
/// set (as `cargo xtask test` sets it once it has installed them).
fn browser_or_skip() -> bool {
    if which(&["chromedriver"]).is_some() && which(&["chromium", "chromium-browser"]).is_some() {
        return true;
    }
    if std::env::var_os("PRIMA_REQUIRE_BROWSER").is_some() {
        panic!("chromium and chromedriver are missing (apt-get install chromium chromium-driver)");
    }
    eprintln!("note: skipping, chromium or chromedriver is missing");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver; cargo xtask test runs it"]
async fn chat_streams_stops_and_loads_nothing_from_outside() {
    let Some(model) = smollm2() else { return };
    if !browser_or_skip() {
        return;
    }
    let server = Server::start(&model, &[]);
    // The page is served with a policy that lets it load from this host only.
    let page_response = server_support::agent()
        .get(format!("{}/", server.url))
        .call()
        .unwrap();
    let csp = page_response
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(csp.starts_with("default-src 'self'"), "CSP: {csp:?}");

    let driver = Driver::start();
    let page = driver.browser(1280, 900).await;
    page.goto(&format!("{}/", server.url)).await.unwrap();
    // One device: this one, the head.
    wait_for(
        &page,
        "document.querySelectorAll('#devices .device[data-link=\"up\"]').length === 1",
        "one device",
    )
    .await;
    wait_for(
        &page,
        "document.getElementById('conn').dataset.state === 'open'",
        "the event stream",
    )
    .await;

    // Every request so far went to this host; the first load's weight.
    let load = eval(
        &page,
        "(() => { const nav = performance.getEntriesByType('navigation')[0];
           const res = performance.getEntriesByType('resource');
           return { origin: location.origin, page: nav.transferSize, body: nav.encodedBodySize,
                    resources: res.map(r => ({ url: r.name, kind: r.initiatorType,
                                               size: r.transferSize, body: r.encodedBodySize })) }; })()",
    )
    .await;
    let origin = load["origin"].as_str().unwrap();
    let resources = load["resources"].as_array().unwrap();
    for r in resources {
        let url = r["url"].as_str().unwrap();
        assert!(
            url.starts_with(&format!("{origin}/")),
            "a request outside the host: {url}"
        );
    }
    let kinds: Vec<&str> = resources
        .iter()
        .filter_map(|r| r["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"script") && kinds.contains(&"link"),
        "{load}"
    );
    let transferred: u64 = load["page"].as_u64().unwrap()
        + resources
            .iter()
            .filter(|r| matches!(r["kind"].as_str(), Some("script" | "link")))
            .map(|r| r["size"].as_u64().unwrap_or(0))
            .sum::<u64>();
    let bodies: u64 = load["body"].as_u64().unwrap()
        + resources
            .iter()
            .filter(|r| matches!(r["kind"].as_str(), Some("script" | "link")))
            .map(|r| r["body"].as_u64().unwrap_or(0))
            .sum::<u64>();
    eprintln!(
        "page weight: {transferred} bytes transferred on first load ({bodies} bytes of HTML, CSS and JS), {} requests, all to {origin}",
        resources.len() + 1
    );
    assert!(bodies > 1000 && bodies < 64 * 1024, "{load}");

    // A prompt: the reply streams in, piece by piece.
    send(
        &page,
        "Tell me a long story about a lighthouse keeper and his cat.",
        400,
    )
    .await;
    wait_for(
        &page,
        &format!("{LAST_REPLY} && {LAST_REPLY}.dataset.state === 'streaming' && {LAST_REPLY}.querySelector('.content').textContent.length > 40"),
        "streamed text",
    )
    .await;
    screenshot(&page, "chat-mid-stream.png").await;
    // Stop: the stream is dropped and the reply marked stopped, with what came so far.
    page.find(Locator::Id("stop"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(reply_done(&page).await, "stopped");
    let text = eval(
        &page,
        &format!("{LAST_REPLY}.querySelector('.content').textContent"),
    )
    .await;
    assert!(text.as_str().unwrap().len() > 40, "{text}");

    // A new conversation; a short reply runs to its end, and the panel shows the measured TPOT.
    page.find(Locator::Id("new"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(
        eval(&page, "document.querySelectorAll('#messages .msg').length").await,
        0
    );
    send(&page, "Say hello.", 24).await;
    assert_eq!(reply_done(&page).await, "done");
    wait_for(
        &page,
        "document.getElementById('measured').textContent.endsWith('ms')",
        "the measured TPOT",
    )
    .await;

    // A phone's width: nothing wider than the screen.
    page.set_window_size(390, 844).await.unwrap();
    wait_for(&page, "window.innerWidth <= 400", "a narrow window").await;
    let overflow = eval(
        &page,
        "document.documentElement.scrollWidth - window.innerWidth",
    )
    .await;
    assert!(
        overflow.as_i64().unwrap() <= 0,
        "the page is {overflow} px wider than a phone"
    );
    screenshot(&page, "phone-390px.png").await;
    page.close().await.unwrap();
}

/// A `prima node` at a fixed loopback address, which it can be restarted at.
struct Node {
    child: Child,
    addr: String,
    model: PathBuf,
}

impl Node {
    fn start(model: &Path) -> Node {
        let addr = format!("127.0.0.1:{}", free_port());
        Node {
            child: spawn_node(model, &addr),
            addr,
            model: model.to_path_buf(),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn restart(&mut self) {
        self.kill();
        self.child = spawn_node(&self.model, &self.addr);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_node(model: &Path, addr: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["node", "--listen", addr, "-t", "1", "-m"])
        .arg(model)
        .arg("--key-file")
        .arg(&common::test_key().0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start prima node");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("node: listening on ") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the node prints its address");
    child
}

/// A manifest of three devices: the head here, `nodes` at their addresses, profiles
/// pinned so that none holds SmolLM2 alone (a ring of three, as in `tests/failover.rs`).
fn ring_manifest(dir: &Path, model: &Path, nodes: &[&Node]) -> PathBuf {
    let mut manifest = format!("[model]\npath = {:?}\n", model.display().to_string());
    let mut profiles = String::new();
    let names = ["desktop", "laptop", "tablet"];
    for (i, name) in names.iter().enumerate() {
        manifest.push_str(&format!("\n[[device]]\nname = \"{name}\"\nthreads = 1\n"));
        match i {
            0 => manifest.push_str("head = true\nlocal = true\n"),
            _ => manifest.push_str(&format!("address = \"{}\"\n", nodes[i - 1].addr)),
        }
        profiles.push_str(&format!(
            r#"
[[device]]
name = "{name}"
os = "linux"
cpu_cores = 1
cpu_gflops = {{ q4_k = 20, q5_k = 20, q6_k = 20, q8_0 = 20, f16 = 10, f32 = 5 }}
cpu_read_gb_s = 10
memcpy_gb_s = 5
ram_total_gib = 0.045
ram_available_gib = 0.045
disk_seq_gb_s = 0.5
disk_rand_gb_s = 0.2
link = {{ rtt_ms = 0.1, bytes_per_s = 1.0e9 }}
"#
        ));
    }
    manifest.push_str(
        "\n[policy]\nscheduler = \"halda\"\nprofiles = \"profiles.toml\"\nctx = 512\nbatch = 64\n\n[server]\nlisten = \"127.0.0.1:0\"\n",
    );
    manifest.push_str(&format!(
        "\n[security]\nkey_file = {:?}\n",
        common::test_key().0.display().to_string()
    ));
    std::fs::write(dir.join("profiles.toml"), profiles).unwrap();
    let path = dir.join("cluster.toml");
    std::fs::write(&path, manifest).unwrap();
    path
}

const DEVICE: &str = "document.querySelector('#devices .device[data-name=\"tablet\"]')";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver; cargo xtask test runs it"]
async fn a_ring_of_three_shows_a_lost_device_and_its_return() {
    let Some(model) = smollm2() else { return };
    if !browser_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("prima-web-ring-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let nodes = [Node::start(&model), Node::start(&model)];
    let manifest = ring_manifest(&dir, &model, &[&nodes[0], &nodes[1]]);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
    cmd.args(["serve", "--manifest"]).arg(&manifest);
    let server = Server::spawn(cmd);
    let [_, mut tablet] = nodes;

    let driver = Driver::start();
    let page = driver.browser(1280, 1000).await;
    page.goto(&format!("{}/", server.url)).await.unwrap();
    wait_for(
        &page,
        "document.querySelectorAll('#devices .device[data-link=\"up\"]').length === 3",
        "three devices up",
    )
    .await;
    // The nodes' backends are there from the start; the plan's k and predicted TPOT too.
    wait_for(
        &page,
        &format!("{DEVICE}.querySelector('.facts').textContent.includes('cpu')"),
        "the node's backend",
    )
    .await;
    assert_ne!(
        eval(&page, "document.getElementById('predicted').textContent").await,
        "–"
    );
    send(&page, "Name three colours.", 16).await;
    assert_eq!(reply_done(&page).await, "done");
    // After a request: each device's share of the token's time.
    wait_for(
        &page,
        &format!("{DEVICE}.textContent.includes('share of each token')"),
        "the shares",
    )
    .await;
    screenshot(&page, "ring-of-three.png").await;

    // The tablet's node dies; the next request goes on without it, and the page says so.
    tablet.kill();
    page.find(Locator::Id("new"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    send(&page, "Name three animals.", 16).await;
    assert_eq!(
        reply_done(&page).await,
        "done",
        "the request survives the loss"
    );
    wait_for(
        &page,
        &format!("{DEVICE}.dataset.link === 'lost'"),
        "the tablet lost",
    )
    .await;
    wait_for(
        &page,
        "document.querySelector('#events li[data-kind=\"lost\"]')",
        "a lost event",
    )
    .await;
    assert_eq!(
        eval(
            &page,
            "document.querySelectorAll('#devices .device[data-link=\"up\"]').length"
        )
        .await,
        2
    );
    screenshot(&page, "lost-device.png").await;

    // It restarts at its address: planned back in between requests.
    tablet.restart();
    let deadline = Instant::now() + PATIENCE;
    loop {
        page.find(Locator::Id("new"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        send(&page, "Hi", 1).await;
        reply_done(&page).await;
        if eval(&page, &format!("{DEVICE}.dataset.link === 'up'")).await == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tablet was never planned back in"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_for(
        &page,
        "document.querySelector('#events li[data-kind=\"back\"]')",
        "a back event",
    )
    .await;
    screenshot(&page, "device-back.png").await;
    page.close().await.unwrap();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
