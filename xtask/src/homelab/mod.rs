//! `cargo xtask homelab up | down | status | check | exec | bench`: emulated home devices on this machine.
//!
//! Each device of a testbed file (`manifests/testbeds/homelab/*.toml`) becomes a set of
//! cgroup-v1 groups (memory with page cache counted, a CFS CPU quota, a cpuset, a blkio
//! read limit), its own uncached copy of the model, and a network namespace whose only
//! link is a TUN interface of the link router, which delays packets by the devices' link
//! latencies (tbf caps each device's upload). Non-head devices run `prima node`; the
//! head runs what the user runs in it (`homelab exec`). Root, cgroup v1 and iproute2 only.
//!
//! Module map: `testbed` (the file format), `cgroups`, `netns`, `router` (the latency),
//! `model_copy`, `processes` (start and stop inside a device), `state` (what is up),
//! `bench` (issue 15's experiments on a bed).

mod bench;
mod cgroups;
mod model_copy;
mod netns;
mod processes;
mod router;
mod state;
mod testbed;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use self::cgroups::Hierarchies;
use self::state::{BedState, DeviceState};
use self::testbed::Testbed;
use crate::layout::Layout;

/// The port every `prima node` listens on, at its device's address.
const NODE_PORT: u16 = 9000;
/// Memory a device needs to be profiled (`prima apply` asks every node for a profile).
const PROFILER_NEEDS: u64 = 160 << 20;

#[derive(clap::Subcommand, Debug)]
pub enum HomelabCommand {
    /// Build the devices of TESTBED (a file, or a name under manifests/testbeds/homelab/)
    /// and start a `prima node` on each device but the head.
    Up {
        testbed: String,
        #[command(flatten)]
        overrides: Overrides,
        /// Use the `prima` already built instead of running cargo build first.
        #[arg(long)]
        no_build: bool,
    },
    /// Remove every process, namespace, interface, cgroup and model copy the home lab
    /// made (all beds; TESTBED only limits which state directories are removed first).
    /// Safe to re-run, and after a crash.
    Down { testbed: Option<String> },
    /// What exists: beds, devices, processes, namespaces, cgroups.
    Status,
    /// Whether a bed can be brought up now; if not, what is missing or already up.
    Check,
    /// Run a command inside a device (its cgroups and network namespace), e.g.
    /// `homelab exec smoke-2 d1 -- prima run …`.
    Exec {
        testbed: String,
        device: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Issue 15's experiments on a bed, one same-run table per model: paper (llama.cpp
    /// and Prima alone on the best device, the ring under Halda, MemSched, PerfSched,
    /// without prefetch, without release), rounds (PRP rounds k, with and without
    /// release), links (Halda at 1, 5, 20 ms); writes target/homelab-bench*.{md,json}.
    Bench(bench::BenchArgs),
    /// The link router (started by `up`).
    #[command(hide = true)]
    LinkRouter {
        #[arg(long = "port", required = true)]
        ports: Vec<String>,
    },
}

/// What `up` changes of the testbed file, for every device.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Overrides {
    /// Every device runs this model instead of the testbed's.
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Every device's link gets this one-way latency (ms) instead of the testbed's.
    #[arg(long, value_name = "MS")]
    pub latency_ms: Option<f64>,
    /// Every device's link gets this upload rate (Mbit/s) instead of the testbed's.
    #[arg(long, value_name = "MBIT")]
    pub link_mbit: Option<f64>,
}

pub fn run(layout: &Layout, command: HomelabCommand) -> Result<u8> {
    match command {
        HomelabCommand::Up {
            testbed,
            overrides,
            no_build,
        } => up(layout, &testbed, &overrides, no_build)?,
        HomelabCommand::Down { testbed } => down(testbed.as_deref())?,
        HomelabCommand::Status => status()?,
        HomelabCommand::Check => {
            ready()?;
            println!("homelab: this machine can bring a bed up");
        }
        HomelabCommand::Bench(args) => bench::run(layout, &args)?,
        HomelabCommand::Exec {
            testbed,
            device,
            command,
        } => return exec(&testbed, &device, &command),
        HomelabCommand::LinkRouter { ports } => {
            let ports: Vec<router::Port> = ports
                .iter()
                .map(|p| router::Port::parse(p))
                .collect::<Result<_>>()?;
            router::run(&ports)?;
        }
    }
    Ok(0)
}

/// Fails, saying what is missing, unless this machine can host a bed.
fn check_machine() -> Result<Hierarchies> {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the home lab needs root (cgroups, namespaces, TUN interfaces)");
    }
    let hierarchies = Hierarchies::discover()?;
    netns::check_tools()?;
    for tool in ["nsenter", "unshare"] {
        if !crate::shell::on_path(tool) {
            bail!("`{tool}` is not on PATH: install the util-linux package");
        }
    }
    if !Path::new("/dev/net/tun").exists() {
        bail!("/dev/net/tun is missing (load the tun module: modprobe tun)");
    }
    Ok(hierarchies)
}

/// Fails, saying what is missing or what is up, unless a bed can be brought up now.
/// `up`, `homelab check` and `cargo xtask test` (whether to run the smoke bed) ask this.
pub fn ready() -> Result<Hierarchies> {
    let hierarchies = check_machine()?;
    let leftovers = what_exists(&hierarchies);
    if !leftovers.is_empty() {
        bail!(
            "a home lab is already up ({}): run `cargo xtask homelab down` first",
            leftovers.join(", ")
        );
    }
    Ok(hierarchies)
}

/// A testbed argument: a path, or a name under manifests/testbeds/homelab/.
fn testbed_path(layout: &Layout, arg: &str) -> PathBuf {
    let path = PathBuf::from(arg);
    if path.exists() || arg.contains('/') {
        return path;
    }
    layout
        .workspace
        .join("manifests/testbeds/homelab")
        .join(format!("{arg}.toml"))
}

/// `$CARGO_TARGET_DIR/release` (or `target/release`), after building it unless told not to.
fn release_dir(layout: &Layout, no_build: bool) -> Result<PathBuf> {
    if !no_build {
        crate::build_tools::ensure_for_cargo(layout)?;
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        crate::shell::run(
            Command::new(cargo)
                .args(["build", "--release", "--workspace", "--exclude", "xtask"])
                .current_dir(&layout.workspace),
        )?;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| layout.workspace.join("target"));
    let dir = target.join("release");
    if !dir.join("prima").exists() {
        bail!(
            "{} is missing (build it, or drop --no-build)",
            dir.join("prima").display()
        );
    }
    Ok(dir)
}

fn up(layout: &Layout, arg: &str, overrides: &Overrides, no_build: bool) -> Result<()> {
    let hierarchies = ready()?;
    let mut bed = Testbed::load(&testbed_path(layout, arg))?;
    if let Some(model) = &overrides.model {
        bed.override_model(model);
    }
    bed.override_links(overrides.latency_ms, overrides.link_mbit)?;
    for d in &bed.devices {
        if !d.model.is_file() {
            bail!(
                "device '{}': model {} is missing (`cargo xtask setup` fetches SmolLM2; \
                 `cargo xtask bench-models` makes the bench models)",
                d.name,
                d.model.display()
            );
        }
    }
    let bin = release_dir(layout, no_build)?;
    match build(&hierarchies, &bed, arg, &bin) {
        Ok(state) => {
            report(&state, &bin);
            Ok(())
        }
        Err(err) => {
            eprintln!("homelab: up failed, removing what it made");
            if let Err(e) = down(Some(&bed.name)) {
                eprintln!("homelab: down failed too: {e:#}");
            }
            Err(err)
        }
    }
}

/// Builds every device of `bed` and starts its nodes; the state file is written as soon
/// as the directory exists, so a crash leaves a trail for `down`.
fn build(hierarchies: &Hierarchies, bed: &Testbed, arg: &str, bin: &Path) -> Result<BedState> {
    let dir = state::root().join(&bed.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let disk = cgroups::disk_of(&dir)?;
    if disk.is_none() && bed.devices.iter().any(|d| d.disk_read.is_some()) {
        eprintln!(
            "homelab: warning: {} is not on a block device; disk_read limits are not applied",
            dir.display()
        );
    }
    let mut st = BedState {
        testbed: bed.name.clone(),
        testbed_file: PathBuf::from(arg),
        dir: dir.clone(),
        router_pid: None,
        devices: Vec::new(),
        manifest: dir.join("cluster.toml"),
        run_command: Vec::new(),
        apply_command: Vec::new(),
    };
    for (i, d) in bed.devices.iter().enumerate() {
        let ddir = dir.join(&d.name);
        std::fs::create_dir_all(&ddir)?;
        st.devices.push(DeviceState {
            name: d.name.clone(),
            head: d.head,
            namespace: netns::namespace(&d.name),
            address: netns::address(i).to_string(),
            node: (!d.head).then(|| format!("{}:{NODE_PORT}", netns::address(i))),
            pid: None,
            model_copy: ddir.join(d.model.file_name().unwrap_or("model.gguf".as_ref())),
            log: ddir.join("node.log"),
            memory: d.memory,
            cpu: d.cpu,
            disk_read: d.disk_read,
            disk: disk.clone(),
            link_mbit: d.link_mbit,
            latency_ms: d.latency_ms,
        });
    }
    st.save()?;

    for (d, ds) in bed.devices.iter().zip(&st.devices) {
        let (bytes, linked) = model_copy::copy_uncached(&d.model, &ds.model_copy)?;
        println!(
            "homelab: {}: {} MB {} {}, out of the page cache",
            d.name,
            bytes >> 20,
            if linked {
                "hard link (no room for a copy) to"
            } else {
                "copy of"
            },
            d.model.display()
        );
        hierarchies
            .create_device(d, disk.as_deref())
            .with_context(|| format!("device '{}'", d.name))?;
    }

    // The router first: its TUN interfaces appear in this namespace, then move.
    hierarchies.create_router_group()?;
    let ports: Vec<router::Port> = bed
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| router::Port {
            interface: netns::interface(i),
            address: netns::address(i),
            latency: Duration::from_secs_f64(d.latency_ms / 1000.0),
        })
        .collect();
    let mut router_argv = vec![
        std::env::current_exe()?.display().to_string(),
        "homelab".into(),
        "link-router".into(),
    ];
    for p in &ports {
        router_argv.push("--port".into());
        router_argv.push(p.to_arg());
    }
    let router_procs = hierarchies
        .group("memory", cgroups::ROUTER_GROUP)
        .join("cgroup.procs");
    let mut cmd = Command::new("sh");
    // The router stands in for network hardware: it must not queue behind the devices.
    cmd.args(["-c", r#"echo $$ > "$0" && exec nice -n -10 "$@""#])
        .arg(&router_procs)
        .args(&router_argv);
    let router_log = dir.join("link-router.log");
    let pid = processes::spawn_detached(&mut cmd, &router_log)?;
    st.router_pid = Some(pid);
    st.save()?;
    processes::wait_for_line(&router_log, "link-router: ", pid, Duration::from_secs(10))
        .context("the link router did not start")?;

    for (i, (d, ds)) in bed.devices.iter().zip(&st.devices).enumerate() {
        netns::create(&ds.namespace)?;
        netns::attach(
            &ds.namespace,
            &netns::interface(i),
            netns::address(i),
            d.link_mbit,
        )
        .with_context(|| format!("device '{}': network", d.name))?;
    }

    let prima = bin.join("prima").display().to_string();
    // The bed's cluster key: every device's links are sealed with it.
    let key = key_file(&st);
    let _ = std::fs::remove_file(&key);
    prima_cluster::prp::key::ClusterKey::generate().write_new(&key)?;
    for i in 0..bed.devices.len() {
        let d = &bed.devices[i];
        if d.head {
            continue;
        }
        let ds = &st.devices[i];
        let mut argv = vec![
            prima.clone(),
            "node".into(),
            "--listen".into(),
            ds.node.clone().expect("a node has an address"),
            "-m".into(),
            ds.model_copy.display().to_string(),
            "--key-file".into(),
            key.display().to_string(),
        ];
        if let Some(t) = d.threads {
            argv.extend(["-t".into(), t.to_string()]);
        }
        if let Some(b) = d.mem_budget {
            argv.extend(["--mem-budget".into(), b.to_string()]);
        }
        let mut cmd = device_command(hierarchies, &st, ds, &argv);
        let pid = processes::spawn_detached(&mut cmd, &ds.log)?;
        st.devices[i].pid = Some(pid);
        st.save()?;
    }
    for ds in st.devices.iter().filter(|d| !d.head) {
        processes::wait_for_line(
            &ds.log,
            "node: listening on ",
            ds.pid.expect("started"),
            Duration::from_secs(120),
        )
        .with_context(|| format!("device '{}': prima node did not start", ds.name))?;
    }

    write_manifest(bed, &st)?;
    st.run_command = run_command(bed, &st, &prima)?;
    st.apply_command = vec![
        prima.clone(),
        "apply".into(),
        st.manifest.display().to_string(),
        "--prompt".into(),
        "Once upon a time".into(),
        "-n".into(),
        "32".into(),
        "--temp".into(),
        "0".into(),
    ];
    st.save()?;
    Ok(st)
}

/// A command running `argv` as device `ds`, with its own profile cache.
fn device_command(
    hierarchies: &Hierarchies,
    st: &BedState,
    ds: &DeviceState,
    argv: &[String],
) -> Command {
    let profiles = st.dir.join(&ds.name).join("profiles");
    processes::in_device(
        &hierarchies.procs_files(&ds.name),
        &ds.namespace,
        &ds.name,
        &[("PRIMA_PROFILE_DIR", profiles.display().to_string())],
        argv,
    )
}

/// The bed's cluster key file.
fn key_file(st: &BedState) -> PathBuf {
    st.dir.join("cluster.key")
}

/// `prima run --ring …` for the head: windows in proportion to the devices' memory limits.
fn run_command(bed: &Testbed, st: &BedState, prima: &str) -> Result<Vec<String>> {
    let head = st.devices.iter().find(|d| d.head).expect("one head");
    // Read from the source: reading the copy here would cache its pages outside the head.
    let source = &bed.devices.iter().find(|d| d.head).expect("one head").model;
    let n_layers = layer_count(source)?;
    // Ring order: the head first, then the nodes as declared.
    let order: Vec<&DeviceState> = std::iter::once(head)
        .chain(st.devices.iter().filter(|d| !d.head))
        .collect();
    let windows = proportional_windows(
        n_layers,
        &order.iter().map(|d| d.memory).collect::<Vec<_>>(),
    );
    let ring: Vec<String> = order[1..]
        .iter()
        .map(|d| d.node.clone().expect("a node"))
        .collect();
    let mut argv = vec![
        prima.to_string(),
        "run".into(),
        "-m".into(),
        head.model_copy.display().to_string(),
        "-c".into(),
        bed.ctx.to_string(),
    ];
    if !ring.is_empty() {
        argv.extend([
            "--ring".into(),
            ring.join(","),
            "--windows".into(),
            windows
                .iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
                .join(","),
            "--key-file".into(),
            key_file(st).display().to_string(),
        ]);
    }
    argv.extend([
        "-p".into(),
        "Once upon a time".into(),
        "-n".into(),
        "32".into(),
    ]);
    Ok(argv)
}

fn layer_count(model: &Path) -> Result<usize> {
    let gguf = prima_core::gguf::GgufFile::open(model)
        .with_context(|| format!("reading {}", model.display()))?;
    let arch = gguf.architecture()?.to_string();
    gguf.get(&format!("{arch}.block_count"))
        .and_then(|v| v.as_u64())
        .map(|n| n as usize)
        .with_context(|| format!("{}: no {arch}.block_count", model.display()))
}

/// `n` layers split in proportion to `weights`, each device at least one (largest
/// remainders get the leftovers).
fn proportional_windows(n: usize, weights: &[u64]) -> Vec<usize> {
    let m = weights.len();
    if n < m {
        return (0..m).map(|i| usize::from(i < n)).collect();
    }
    let total: f64 = weights.iter().map(|&w| w as f64).sum();
    let spare = (n - m) as f64;
    let shares: Vec<f64> = weights.iter().map(|&w| spare * w as f64 / total).collect();
    let mut windows: Vec<usize> = shares.iter().map(|s| 1 + s.floor() as usize).collect();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| {
        (shares[b] - shares[b].floor()).total_cmp(&(shares[a] - shares[a].floor()))
    });
    let mut left = n - windows.iter().sum::<usize>();
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        windows[i] += 1;
        left -= 1;
    }
    windows
}

/// The bed as a Prima cluster manifest: the head local, the nodes by address.
fn write_manifest(bed: &Testbed, st: &BedState) -> Result<()> {
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let head = st.devices.iter().find(|d| d.head).expect("one head");
    let mut text = format!(
        "# Generated by `cargo xtask homelab up {}`: the bed as a cluster manifest.\n\
         # Run it inside the head: cargo xtask homelab exec {} {} -- prima apply {}\n\n\
         [model]\npath = {}\n",
        bed.name,
        bed.name,
        head.name,
        st.manifest.display(),
        q(&head.model_copy.display().to_string()),
    );
    let order = std::iter::once(head).chain(st.devices.iter().filter(|d| !d.head));
    for ds in order {
        let d = bed
            .devices
            .iter()
            .find(|d| d.name == ds.name)
            .expect("same devices");
        text += &format!("\n[[device]]\nname = {}\n", q(&ds.name));
        match &ds.node {
            None => text += "head = true\n",
            Some(addr) => text += &format!("address = {}\n", q(addr)),
        }
        if d.head {
            if let Some(b) = d.mem_budget {
                text += &format!("mem_budget = {b}\n");
            }
            if let Some(t) = d.threads {
                text += &format!("threads = {t}\n");
            }
        }
    }
    text += &format!(
        "\n[policy]\nscheduler = \"halda\"\nctx = {}\n\n[server]\nlisten = {}\n\n[security]\nkey_file = {}\n",
        bed.ctx,
        q(&format!("{}:8080", head.address)),
        q(&key_file(st).display().to_string()),
    );
    std::fs::write(&st.manifest, text).with_context(|| format!("writing {}", st.manifest.display()))
}

fn report(st: &BedState, _bin: &Path) {
    println!(
        "homelab: testbed '{}' is up ({})",
        st.testbed,
        st.dir.display()
    );
    for d in &st.devices {
        println!(
            "  {:<8} {:<12} mem {:>5} MB  cpu {:.2}  disk {}  link {}  latency {} ms  {}",
            d.name,
            d.address,
            d.memory >> 20,
            d.cpu,
            d.disk_read
                .map(|r| format!("{} MB/s", r >> 20))
                .unwrap_or_else(|| "-".into()),
            d.link_mbit
                .map(|r| format!("{r} Mbit/s"))
                .unwrap_or_else(|| "-".into()),
            d.latency_ms,
            match &d.node {
                Some(n) => format!("node {n}"),
                None => "head".into(),
            }
        );
    }
    let head = st.devices.iter().find(|d| d.head).expect("one head");
    let exec = format!("cargo xtask homelab exec {} {} --", st.testbed, head.name);
    println!("Run inside the head:");
    println!("  {exec} {}", shell_words(&st.run_command));
    println!("  {exec} {}", shell_words(&st.apply_command));
    // prima-core's profiler measures memory bandwidth over a 128 MiB buffer.
    let small: Vec<&str> = st
        .devices
        .iter()
        .filter(|d| d.memory < PROFILER_NEEDS)
        .map(|d| d.name.as_str())
        .collect();
    if !small.is_empty() {
        println!(
            "  (note: `prima apply` profiles every device, and profiling takes about {} MB; \
             under a lower limit {} will be OOM-killed: use `prima run --ring` there)",
            PROFILER_NEEDS >> 20,
            small.join(", ")
        );
    }
    println!("Manifest: {}", st.manifest.display());
    println!("State:    {}", BedState::file(&st.dir).display());
    println!("Stop:     cargo xtask homelab down {}", st.testbed);
}

fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "\"'$".contains(c)) {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn exec(testbed: &str, device: &str, command: &[String]) -> Result<u8> {
    let hierarchies = check_machine()?;
    let st = BedState::load(&state::root().join(testbed))
        .with_context(|| format!("testbed '{testbed}' is not up"))?;
    let Some(ds) = st.device(device) else {
        bail!(
            "testbed '{testbed}' has no device '{device}' (it has {})",
            st.devices
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let status = device_command(&hierarchies, &st, ds, command)
        .status()
        .context("cannot start the command")?;
    Ok(status.code().map(|c| c as u8).unwrap_or(1))
}

/// Everything of the home lab's that exists on this machine, named.
fn what_exists(hierarchies: &Hierarchies) -> Vec<String> {
    let mut found: Vec<String> = state::beds_up()
        .into_iter()
        .map(|b| format!("state of '{b}'"))
        .collect();
    found.extend(
        netns::existing()
            .into_iter()
            .map(|n| format!("namespace {n}")),
    );
    if hierarchies.any() {
        found.push(format!("cgroups {}/", cgroups::PARENT));
    }
    found
}

fn down(testbed: Option<&str>) -> Result<()> {
    let hierarchies = check_machine()?;
    // Processes first: in our cgroups (nodes, the router, `exec`s) or in our namespaces.
    let mut pids = hierarchies.pids();
    let namespaces = netns::existing();
    for ns in &namespaces {
        pids.extend(netns::pids(ns));
    }
    pids.sort_unstable();
    pids.dedup();
    if !pids.is_empty() {
        println!("homelab: stopping {} processes", pids.len());
        processes::stop(&pids, Duration::from_secs(5));
    }
    for ns in &namespaces {
        netns::delete(ns)?;
        println!("homelab: removed namespace {ns}");
    }
    // A group can be removed only once the kernel has seen its last task leave.
    let mut tries = 0;
    while let Err(err) = hierarchies.remove_all() {
        tries += 1;
        if tries > 50 {
            return Err(err.context("cgroups still busy"));
        }
        processes::stop(&hierarchies.pids(), Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(100));
    }
    let beds = match testbed {
        Some(name) => vec![name.to_string()],
        None => state::beds_up(),
    };
    for bed in beds.iter().chain(state::beds_up().iter()) {
        let dir = state::root().join(bed);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            println!("homelab: removed {}", dir.display());
        }
    }
    let left = what_exists(&hierarchies);
    if !left.is_empty() {
        bail!("still there after down: {}", left.join(", "));
    }
    println!("homelab: nothing left");
    Ok(())
}

fn status() -> Result<()> {
    let hierarchies = check_machine()?;
    let beds = state::beds_up();
    if beds.is_empty() && what_exists(&hierarchies).is_empty() {
        println!("homelab: nothing is up");
        return Ok(());
    }
    for bed in &beds {
        let dir = state::root().join(bed);
        match BedState::load(&dir) {
            Ok(st) => {
                println!("testbed {bed} ({})", dir.display());
                for d in &st.devices {
                    let memory = hierarchies.group("memory", &d.name);
                    let read = |f: &str| {
                        std::fs::read_to_string(memory.join(f))
                            .map(|s| (s.trim().parse::<u64>().unwrap_or(0) >> 20).to_string())
                            .unwrap_or_else(|_| "?".into())
                    };
                    let state = match (d.head, d.pid) {
                        (true, _) => "head".into(),
                        (false, Some(p)) if processes::alive(p) => format!("node pid {p} running"),
                        (false, Some(p)) => format!("node pid {p} GONE"),
                        (false, None) => "node not started".into(),
                    };
                    println!(
                        "  {:<8} {:<10} memory {}/{} MB  {}  net: {}",
                        d.name,
                        d.address,
                        read("memory.usage_in_bytes"),
                        read("memory.limit_in_bytes"),
                        state,
                        netns::describe(&d.namespace),
                    );
                }
                match st.router_pid {
                    Some(p) if processes::alive(p) => println!("  link router pid {p} running"),
                    Some(p) => println!("  link router pid {p} GONE"),
                    None => {}
                }
            }
            Err(e) => println!("testbed {bed}: {e:#}"),
        }
    }
    println!("namespaces: {}", netns::existing().join(" "));
    let groups: Vec<String> = hierarchies
        .existing()
        .iter()
        .map(|(c, g, _)| format!("{c}/{}/{g}", cgroups::PARENT))
        .collect();
    println!("cgroups:    {}", groups.join(" "));
    println!("processes:  {:?}", hierarchies.pids());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_the_weights_and_cover_every_layer() {
        assert_eq!(proportional_windows(30, &[1, 1]), vec![15, 15]);
        let w = proportional_windows(30, &[600, 200, 100]);
        assert_eq!(w.iter().sum::<usize>(), 30);
        assert!(w[0] > w[1] && w[1] > w[2] && w[2] >= 1, "{w:?}");
        assert_eq!(proportional_windows(2, &[5, 1, 1]), vec![1, 1, 0]);
    }
}
