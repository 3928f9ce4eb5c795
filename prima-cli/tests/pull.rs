//! `prima pull`, `-hf`, `prima list` and `prima rm` against a Hugging Face Hub served by
//! this test from files on disk (the Hub's URL layout, `HF_ENDPOINT` pointing at it):
//! a fresh download, one broken off mid-file and resumed, a corrupted one refused, a
//! split model joined, and `prima run -hf` from the cache with the server gone. Never
//! touches the network.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prima_core::gguf::{GgufFile, GgufWriter, Value};
use sha2::{Digest, Sha256};

const REPO: &str = "test/SmolLM2-135M-GGUF";
const FILE: &str = "SmolLM2-135M-Q4_K_M.gguf";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

struct Served {
    disk: PathBuf,
    size: u64,
    sha256: String,
}

#[derive(Default)]
struct State {
    /// Repository → its files by path.
    repos: HashMap<String, HashMap<String, Served>>,
    /// File path → how many more requests for it are cut off halfway.
    cut: HashMap<String, usize>,
    /// File paths served with one byte changed.
    corrupt: Vec<String>,
    /// Every file request: (path, first byte asked for).
    requests: Vec<(String, u64)>,
}

/// A Hub on a loopback port, stopped when dropped.
struct Hub {
    addr: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl Hub {
    fn start() -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let s = s.clone();
                if let Ok(conn) = conn {
                    std::thread::spawn(move || {
                        let _ = answer(conn, &s);
                    });
                }
            }
        });
        Hub { addr, state, stop }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn add(&self, repo: &str, path: &str, disk: &Path) {
        let bytes = std::fs::read(disk).unwrap();
        let served = Served {
            disk: disk.to_path_buf(),
            size: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
        };
        let mut st = self.state.lock().unwrap();
        st.repos
            .entry(repo.into())
            .or_default()
            .insert(path.into(), served);
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn answer(mut conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = line.split(' ').nth(1).unwrap_or("").to_string();
    let mut range_from = 0;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        if h.trim().is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
            range_from = v.trim().trim_end_matches('-').parse().unwrap_or(0);
        }
    }
    let json = |conn: &mut TcpStream, status: &str, body: String| {
        write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let mut st = state.lock().unwrap();
    if let Some(rest) = target.strip_prefix("/api/models/") {
        let (repo, what) = match rest.find("/revision/").or_else(|| rest.find("/tree/")) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let Some(files) = st.repos.get(repo) else {
            return json(
                &mut conn,
                "404 Not Found",
                r#"{"error":"Repository not found"}"#.into(),
            );
        };
        if what.starts_with("/revision/main") {
            return json(
                &mut conn,
                "200 OK",
                format!(r#"{{"id":"{repo}","sha":"{COMMIT}"}}"#),
            );
        }
        let mut entries =
            vec![r#"{"type":"file","oid":"aa","size":12,"path":"README.md"}"#.to_string()];
        for (path, f) in files {
            entries.push(format!(
                r#"{{"type":"file","oid":"bb","size":{},"lfs":{{"oid":"{}","size":{},"pointerSize":134}},"path":"{path}"}}"#,
                f.size, f.sha256, f.size
            ));
        }
        return json(&mut conn, "200 OK", format!("[{}]", entries.join(",")));
    }
    let prefix = format!("/resolve/{COMMIT}/");
    let Some(i) = target.find(&prefix) else {
        return json(
            &mut conn,
            "404 Not Found",
            r#"{"error":"Entry not found"}"#.into(),
        );
    };
    let (repo, path) = (&target[1..i], target[i + prefix.len()..].to_string());
    let Some(f) = st.repos.get(repo).and_then(|r| r.get(&path)) else {
        return json(
            &mut conn,
            "404 Not Found",
            r#"{"error":"Entry not found"}"#.into(),
        );
    };
    let (disk, size) = (f.disk.clone(), f.size);
    st.requests.push((path.clone(), range_from));
    let cut = match st.cut.get_mut(&path) {
        Some(n) if *n > 0 => {
            *n -= 1;
            true
        }
        _ => false,
    };
    let corrupt = st.corrupt.contains(&path);
    drop(st);
    let mut bytes = std::fs::read(disk)?;
    if corrupt {
        bytes[size as usize / 2] ^= 0x55;
    }
    let body = &bytes[range_from as usize..];
    let status = if range_from > 0 {
        format!(
            "206 Partial Content\r\nContent-Range: bytes {range_from}-{}/{size}",
            size - 1
        )
    } else {
        "200 OK".into()
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    // Cut off: half of what was asked, then the connection closes.
    let end = if cut { body.len() / 2 } else { body.len() };
    conn.write_all(&body[..end])?;
    conn.flush()?;
    if cut {
        conn.shutdown(std::net::Shutdown::Both)?;
    }
    Ok(())
}

/// A scratch cache for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prima-pull-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn prima(cache: &Path, endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(args)
        .env("PRIMA_CACHE_DIR", cache)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .expect("run prima")
}

fn text(o: &Output) -> (String, String) {
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    println!("--- stdout\n{out}--- stderr\n{err}");
    (out, err)
}

fn model() -> Option<PathBuf> {
    common::model_or_skip(common::derived_models().join("smollm2-135m-q4_k_m.gguf"))
}

fn sha256_file(p: &Path) -> String {
    let mut f = std::fs::File::open(p).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex::encode(h.finalize())
}

#[test]
fn fresh_pull_list_run_offline_and_rm() {
    let Some(model) = model() else { return };
    let cache = scratch("fresh");
    let hub = Hub::start();
    hub.add(REPO, FILE, &model);
    hub.add(REPO, "SmolLM2-135M-Q8_0-other.gguf", &model);

    let o = prima(&cache, &hub.endpoint(), &["pull", REPO]);
    let (out, err) = text(&o);
    assert!(o.status.success());
    assert!(
        err.contains(&format!("{FILE} (100.6 MiB) downloaded, SHA-256 ok")),
        "{err}"
    );
    let path = PathBuf::from(out.trim());
    assert!(
        path.ends_with(format!("snapshots/{COMMIT}/{FILE}")),
        "{out}"
    );
    assert_eq!(sha256_file(&path), sha256_file(&model));

    // Pulled again: nothing is downloaded.
    let o = prima(
        &cache,
        &hub.endpoint(),
        &["pull", &format!("{REPO}:q4_k_m")],
    );
    let (_, err) = text(&o);
    assert!(
        o.status.success() && err.contains(&format!("{FILE} is cached")),
        "{err}"
    );

    let o = prima(&cache, &hub.endpoint(), &["list", "--verify"]);
    let (out, _) = text(&o);
    assert!(o.status.success());
    assert!(
        out.contains(REPO) && out.contains(FILE) && out.contains("sha ok"),
        "{out}"
    );

    // With the Hub gone, `run -hf` takes the cached copy and says the same as the file.
    drop(hub);
    let run = |how: &[&str]| {
        let mut args = vec!["run"];
        args.extend_from_slice(how);
        args.extend_from_slice(&[
            "-p",
            "The capital of France is",
            "-n",
            "8",
            "--temp",
            "0",
            "-t",
            "2",
        ]);
        let o = prima(&cache, "http://127.0.0.1:9", &args);
        let (out, _) = text(&o);
        assert!(o.status.success());
        out
    };
    let direct = run(&["-m", model.to_str().unwrap()]);
    assert_eq!(run(&["-hf", REPO]), direct);
    assert_eq!(run(&["--hf-repo", &format!("{REPO}:Q4_K_M")]), direct);

    // `pull` with the Hub unreachable: the cached copy, with a note.
    let o = prima(&cache, "http://127.0.0.1:9", &["pull", REPO]);
    let (out, err) = text(&o);
    assert!(
        o.status.success() && err.contains("cannot reach") && err.contains("using the cached"),
        "{err}"
    );
    assert_eq!(PathBuf::from(out.trim()), path);

    let o = prima(
        &cache,
        "http://127.0.0.1:9",
        &["rm", &format!("{REPO}:Q4_K_M")],
    );
    let (out, _) = text(&o);
    assert!(o.status.success() && out.contains(FILE));
    let o = prima(&cache, "http://127.0.0.1:9", &["list"]);
    let (out, _) = text(&o);
    assert!(!out.contains(FILE), "{out}");
    let o = prima(&cache, "http://127.0.0.1:9", &["rm", REPO]);
    assert!(o.status.success());
    let o = prima(&cache, "http://127.0.0.1:9", &["rm", REPO]);
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("is not in the cache"),
        "{err}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn an_interrupted_download_resumes_where_it_stopped() {
    let Some(model) = model() else { return };
    let cache = scratch("resume");
    let hub = Hub::start();
    hub.add(REPO, FILE, &model);

    // Every attempt of the first run is cut off: the partial file is kept.
    hub.state.lock().unwrap().cut.insert(FILE.into(), 4);
    let o = prima(&cache, &hub.endpoint(), &["pull", REPO]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains(&format!("downloading {FILE}: interrupted at"))
            && err.contains("run the pull again to resume"),
        "{err}"
    );
    let requests = hub.state.lock().unwrap().requests.clone();
    assert_eq!(requests.len(), 4, "{requests:?}");
    assert_eq!(requests[0].1, 0);
    // Each attempt asked for the bytes after those it had.
    assert!(requests.windows(2).all(|w| w[1].1 > w[0].1), "{requests:?}");

    // The next run resumes from there, is cut off once more, resumes again, and checks.
    hub.state.lock().unwrap().cut.insert(FILE.into(), 1);
    let o = prima(&cache, &hub.endpoint(), &["pull", REPO]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(&format!("{FILE}: resuming at")), "{err}");
    assert!(
        err.contains("; resuming") && err.contains("SHA-256 ok"),
        "{err}"
    );
    let requests = hub.state.lock().unwrap().requests.clone();
    assert_eq!(requests.len(), 6, "{requests:?}");
    assert!(
        requests[4].1 >= requests[3].1 && requests[5].1 > requests[4].1,
        "{requests:?}"
    );
    assert_eq!(sha256_file(Path::new(out.trim())), sha256_file(&model));
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_corrupted_download_is_refused_naming_the_file() {
    let Some(model) = model() else { return };
    let cache = scratch("corrupt");
    let hub = Hub::start();
    hub.add(REPO, FILE, &model);
    hub.state.lock().unwrap().corrupt.push(FILE.into());
    let o = prima(&cache, &hub.endpoint(), &["pull", REPO]);
    let (out, err) = text(&o);
    assert!(!o.status.success() && out.is_empty());
    assert!(
        err.contains(&format!(
            "error: {FILE}: corrupted download refused: its SHA-256 is"
        )),
        "{err}"
    );
    // Nothing is left in the cache: no blob, no partial file, no link.
    let repo_dir = cache.join("hub/models--test--SmolLM2-135M-GGUF");
    let blobs: Vec<_> = std::fs::read_dir(repo_dir.join("blobs")).unwrap().collect();
    assert!(blobs.is_empty(), "{blobs:?}");
    assert!(!repo_dir.join("snapshots").join(COMMIT).join(FILE).exists());
    // A run -hf on it fails the same way rather than using a bad file.
    let o = prima(
        &cache,
        &hub.endpoint(),
        &["run", "-hf", REPO, "-p", "x", "-n", "1"],
    );
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("corrupted download refused"),
        "{err}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}

/// Writes `model` as two split files the way llama.cpp's gguf-split does: the metadata
/// in the first, `split.*` keys in both, the tensors divided between them.
fn split_in_two(model: &Path, dir: &Path, prefix: &str) -> [PathBuf; 2] {
    let f = GgufFile::open(model).unwrap();
    let half = f.tensors().len() / 2;
    let mut out = [PathBuf::new(), PathBuf::new()];
    for (part, path) in out.iter_mut().enumerate() {
        let mut w = GgufWriter::new();
        if part == 0 {
            for (k, v) in f.metadata() {
                w.add(k, v.clone());
            }
        }
        w.add("split.no", Value::U16(part as u16));
        w.add("split.count", Value::U16(2));
        w.add("split.tensors.count", Value::I32(f.tensors().len() as i32));
        let tensors = if part == 0 {
            &f.tensors()[..half]
        } else {
            &f.tensors()[half..]
        };
        for t in tensors {
            w.add_tensor(&t.name, &t.dims, t.ggml_type, f.tensor_data(t))
                .unwrap();
        }
        *path = dir.join(format!("{prefix}-{:05}-of-00002.gguf", part + 1));
        w.write(&*path).unwrap();
    }
    out
}

#[test]
fn a_split_model_is_fetched_whole_and_joined() {
    let Some(model) = model() else { return };
    let cache = scratch("split");
    let parts = split_in_two(&model, &cache, "SmolLM2-135M-F16");
    let hub = Hub::start();
    hub.add(REPO, FILE, &model);
    for p in &parts {
        hub.add(
            REPO,
            &format!("F16/{}", p.file_name().unwrap().to_str().unwrap()),
            p,
        );
    }
    let o = prima(&cache, &hub.endpoint(), &["pull", &format!("{REPO}:f16")]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("SmolLM2-135M-F16-00002-of-00002.gguf") && err.contains("joined 2 parts"),
        "{err}"
    );
    let joined = PathBuf::from(out.trim());
    assert!(
        joined.ends_with(format!("snapshots/{COMMIT}/F16/SmolLM2-135M-F16.gguf")),
        "{out}"
    );
    // The same tensors, metadata and layout as the file that was split: the same bytes.
    assert_eq!(sha256_file(&joined), sha256_file(&model));
    // The parts are gone from the cache; the joined file stands for them.
    let o = prima(&cache, &hub.endpoint(), &["list"]);
    let (list, _) = text(&o);
    assert!(
        list.contains("F16/SmolLM2-135M-F16.gguf") && !list.contains("00001-of"),
        "{list}"
    );
    let o = prima(&cache, &hub.endpoint(), &["pull", &format!("{REPO}:F16")]);
    let (_, err) = text(&o);
    assert!(o.status.success() && err.contains("up to date"), "{err}");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn hf_names_are_checked_and_never_read_as_help() {
    let cache = scratch("names");
    let hub = Hub::start();
    // `-hf` is not `-h -f`: a bad name is an error, not the help text.
    let o = prima(
        &cache,
        &hub.endpoint(),
        &["run", "-hf", "smollm", "-p", "x"],
    );
    let (out, err) = text(&o);
    assert!(!o.status.success() && !out.contains("Usage"));
    assert!(
        err.contains("'smollm' is not a Hugging Face model"),
        "{err}"
    );
    let o = prima(
        &cache,
        &hub.endpoint(),
        &["run", "-hf", "a/b", "-m", "x.gguf", "-p", "x"],
    );
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("cannot be used with"),
        "{err}"
    );
    // A repository the Hub does not have.
    let o = prima(&cache, &hub.endpoint(), &["pull", "nobody/nothing"]);
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("HTTP 404: Repository not found"),
        "{err}"
    );
    // No Hub at all, nothing cached.
    let o = prima(&cache, "http://127.0.0.1:9", &["serve", "-hf", "a/b:Q8_0"]);
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("cannot reach http://127.0.0.1:9"),
        "{err}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_quant_the_repository_lacks_lists_what_it_has() {
    let cache = scratch("quant");
    let hub = Hub::start();
    let dir = cache.join("files");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("m.gguf"), b"not really").unwrap();
    hub.add(REPO, "m-Q8_0.gguf", &dir.join("m.gguf"));
    let o = prima(&cache, &hub.endpoint(), &["pull", &format!("{REPO}:Q2_K")]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains(&format!(
            "{REPO} has no GGUF file matching 'Q2_K'; its GGUF files: m-Q8_0.gguf"
        )),
        "{err}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_manifest_names_its_model_by_hub_name() {
    let Some(model) = model() else { return };
    let cache = scratch("manifest");
    let hub = Hub::start();
    hub.add(REPO, FILE, &model);
    let manifest = cache.join("cluster.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"
[model]
hf = "{REPO}:Q4_K_M"

[[device]]
name = "desktop"
head = true
local = true
threads = 1

[[device]]
name = "laptop"
local = true
threads = 1

[policy]
scheduler = "manual"
windows = [15, 15]
ctx = 256
"#
        ),
    )
    .unwrap();
    let prompt = ["-p", "The capital of France is", "-n", "8"];
    let mut args = vec!["apply", manifest.to_str().unwrap(), "--temp", "0"];
    args.extend_from_slice(&prompt);
    let o = prima(&cache, &hub.endpoint(), &args);
    let (ring, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("model     {REPO}:Q4_K_M → "))
            && err.contains("downloaded, SHA-256 ok"),
        "{err}"
    );
    // The local node was given the pulled file: the ring says what the file says alone.
    let mut args = vec!["run", "-m", model.to_str().unwrap(), "--temp", "0"];
    args.extend_from_slice(&prompt);
    let o = prima(&cache, &hub.endpoint(), &args);
    let (alone, _) = text(&o);
    assert_eq!(ring, alone);
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_node_holding_another_model_is_told_the_hub_name() {
    let Some(model) = model() else { return };
    let Some(other) =
        common::model_or_skip(common::derived_models().join("smollm2-135m-q8_0.gguf"))
    else {
        return;
    };
    let cache = scratch("mismatch");
    let hub = Hub::start();
    hub.add(REPO, FILE, &model);
    let manifest = cache.join("cluster.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"
[model]
hf = "{REPO}"
paths = {{ laptop = "{}" }}

[[device]]
name = "desktop"
head = true
local = true
threads = 1

[[device]]
name = "laptop"
local = true
threads = 1

[policy]
scheduler = "manual"
windows = [15, 15]
ctx = 256
"#,
            other.display()
        ),
    )
    .unwrap();
    let o = prima(
        &cache,
        &hub.endpoint(),
        &["apply", manifest.to_str().unwrap(), "-p", "hi", "-n", "2"],
    );
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("device 'laptop'")
            && err.contains("model mismatch")
            && err.contains(&format!("start its node with `prima node -hf {REPO} …`")),
        "{err}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}
