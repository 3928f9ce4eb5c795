//! The soak's ring on loopback: two `prima node` processes at fixed addresses and a
//! `prima apply` head serving the API, with pinned profiles so the plan is the same
//! ring of three on any machine; and what `/proc` says about each process.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// How long a process has to print that it listens (the machine may be loaded).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A `prima` process whose stderr goes to a log file, watched for one line.
pub struct Process {
    child: Child,
    pub name: String,
    /// Restarts: the process's generation, in its log file's name.
    restarts: usize,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `cmd` with its stderr copied into `log`, and returns once it printed a line
/// starting with `ready` (and what follows that prefix).
fn spawn(mut cmd: Command, log: &Path, ready: &'static str) -> Result<(Child, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let stderr = child.stderr.take().expect("piped");
    let mut file = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix(ready) {
                let _ = tx.send(rest.to_string());
            }
            let _ = writeln!(file, "{line}");
        }
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(rest) => Ok((child, rest)),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{cmd:?} did not print {ready:?} within {START_TIMEOUT:?} (its log: {})",
                log.display()
            )
        }
    }
}

/// Where the soak keeps its manifest and the processes' logs.
pub struct Cluster {
    pub dir: PathBuf,
    prima: PathBuf,
    model: PathBuf,
    /// The two nodes, each with its fixed address.
    pub nodes: Vec<(Process, String)>,
    pub head: Option<Process>,
    /// `http://127.0.0.1:PORT`
    pub url: String,
}

impl Cluster {
    /// Starts two nodes and the head serving a ring of three.
    pub fn start(prima: &Path, model: &Path, dir: &Path) -> Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            prima: prima.to_path_buf(),
            model: model.to_path_buf(),
            nodes: Vec::new(),
            head: None,
            url: String::new(),
        };
        // The ring's links are sealed with a key of the soak's own (`prima keygen`).
        if !cluster.key_file().exists() {
            let status = Command::new(&cluster.prima)
                .args(["keygen", "--out"])
                .arg(cluster.key_file())
                .stdout(std::process::Stdio::null())
                .status()?;
            anyhow::ensure!(status.success(), "prima keygen failed: {status}");
        }
        for name in ["laptop", "tablet"] {
            // A free port now; the node binds it a moment later (and again on restart).
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let addr = format!("127.0.0.1:{port}");
            let node = cluster.spawn_node(name, &addr, 0)?;
            cluster.nodes.push((node, addr));
        }
        let manifest = cluster.write_manifest()?;
        let mut cmd = Command::new(&cluster.prima);
        cmd.arg("apply").arg(&manifest);
        let (child, rest) = spawn(cmd, &dir.join("head.log"), "serve: listening on ")?;
        cluster.url = rest.split(' ').next().unwrap_or_default().to_string();
        cluster.head = Some(Process {
            child,
            name: "head".into(),
            restarts: 0,
        });
        Ok(cluster)
    }

    fn spawn_node(&self, name: &str, addr: &str, restarts: usize) -> Result<Process> {
        let mut cmd = Command::new(&self.prima);
        cmd.args(["node", "--listen", addr, "-t", "1", "-m"])
            .arg(&self.model)
            .arg("--key-file")
            .arg(self.key_file());
        let log = self.dir.join(format!("{name}.{restarts}.log"));
        let (child, _) = spawn(cmd, &log, "node: listening on ")?;
        Ok(Process {
            child,
            name: name.into(),
            restarts,
        })
    }

    /// SIGKILLs node `i`.
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].0.kill();
    }

    /// A new process for node `i`, at its address.
    pub fn restart_node(&mut self, i: usize) -> Result<()> {
        let (old, addr) = &self.nodes[i];
        let (name, restarts, addr) = (old.name.clone(), old.restarts + 1, addr.clone());
        self.nodes[i].0.kill();
        self.nodes[i].0 = self.spawn_node(&name, &addr, restarts)?;
        Ok(())
    }

    /// The head and the nodes, for sampling.
    pub fn processes(&mut self) -> Vec<&mut Process> {
        let mut all: Vec<&mut Process> = self.head.iter_mut().collect();
        all.extend(self.nodes.iter_mut().map(|(p, _)| p));
        all
    }

    /// The cluster key's file, in the soak's directory.
    fn key_file(&self) -> PathBuf {
        self.dir.join("cluster.key")
    }

    /// A manifest with the head here and the nodes at their addresses. The profiles are
    /// pinned: three equal devices, none of which holds SmolLM2's 94 MiB alone, so the
    /// plan is a ring of three whatever this machine's load (and a ring of two while a
    /// node is down), as in prima-core's failover tests.
    fn write_manifest(&self) -> Result<PathBuf> {
        let mut manifest = format!("[model]\npath = {:?}\n", self.model.display().to_string());
        let mut profiles = String::new();
        let devices = [("desktop", None), ("laptop", Some(0)), ("tablet", Some(1))];
        for (name, node) in devices {
            manifest.push_str(&format!("\n[[device]]\nname = \"{name}\"\nthreads = 1\n"));
            match node {
                Some(i) => manifest.push_str(&format!("address = \"{}\"\n", self.nodes[i].1)),
                None => manifest.push_str("head = true\nlocal = true\n"),
            }
            profiles.push_str(&profile(name));
        }
        manifest.push_str(
            "\n[policy]\nscheduler = \"halda\"\nprofiles = \"profiles.toml\"\nctx = 512\nbatch = 64\n\n\
             [server]\nlisten = \"127.0.0.1:0\"\n",
        );
        manifest.push_str(&format!(
            "\n[security]\nkey_file = {:?}\n",
            self.key_file().display().to_string()
        ));
        std::fs::write(self.dir.join("profiles.toml"), profiles)?;
        let path = self.dir.join("cluster.toml");
        std::fs::write(&path, manifest)?;
        Ok(path)
    }
}

/// A device's pinned profile: 0.045 GiB of memory, 20 GFLOP/s.
fn profile(name: &str) -> String {
    format!(
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
    )
}

/// What `/proc` says about one process at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStats {
    pub pid: u32,
    /// Resident memory, KiB (`VmRSS`: includes the model's mapped pages).
    pub rss_kib: u64,
    /// Anonymous resident memory, KiB (`RssAnon`: the heap; what a leak grows).
    pub anon_kib: u64,
    /// Threads (`/proc/PID/task`).
    pub threads: usize,
    /// Open file descriptors (`/proc/PID/fd`).
    pub fds: usize,
}

impl ProcStats {
    pub fn read(pid: u32) -> Result<ProcStats> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("process {pid} is gone"))?;
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        let count = |dir: &str| -> Result<usize> {
            Ok(std::fs::read_dir(format!("/proc/{pid}/{dir}"))
                .with_context(|| format!("cannot list /proc/{pid}/{dir}"))?
                .count())
        };
        Ok(ProcStats {
            pid,
            rss_kib: field("VmRSS:"),
            anon_kib: field("RssAnon:"),
            threads: count("task")?,
            fds: count("fd")?,
        })
    }

    pub fn json(&self) -> Value {
        json!({
            "pid": self.pid,
            "rss_kib": self.rss_kib,
            "rss_anon_kib": self.anon_kib,
            "threads": self.threads,
            "fds": self.fds,
        })
    }
}
