//! `prima profile`: measures this device (compute through the backend plugin, memory,
//! disk, OS memory figures) and prints the profile Halda plans with, and where its memory
//! and core figures came from (the host's, or a cgroup's limits).

use std::path::PathBuf;

use anyhow::Context;
use prima_abi::backend::BackendConfig;
use prima_cluster::profile::{
    profile_with, DeviceProfiles, GpuKind, ProfileOptions, QuantClass, GIB,
};
use prima_core::plugin::{first_gpu_backend, load_backend};

#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    /// The model whose disk is measured (read uncached; nothing is written). Without it,
    /// the disk holding the prima binary is measured.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print a `[[device]]` entry for a profiles file.
    #[arg(long, conflicts_with = "json")]
    pub toml: bool,
    /// Device name (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// Measure again even if a fresh cached profile exists.
    #[arg(long)]
    pub refresh: bool,
    /// Cached profiles older than this many hours are measured again.
    #[arg(long, default_value_t = 24.0)]
    pub max_age_h: f64,
    /// Backend plugin to measure compute with (default: the first one found).
    #[arg(long)]
    pub backend: Option<String>,
    /// GPU backend plugin to profile the GPU with (default: the first usable GPU plugin
    /// found; `none`: profile no GPU).
    #[arg(long, value_name = "NAME")]
    pub gpu_backend: Option<String>,
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
}

pub fn run(args: ProfileArgs) -> anyhow::Result<()> {
    let disk_file = match &args.model {
        Some(m) => {
            if !m.is_file() {
                anyhow::bail!("model file {} does not exist", m.display());
            }
            m.clone()
        }
        None => std::env::current_exe().context("locating the prima binary")?,
    };
    let backend = load_backend(
        args.backend.as_deref(),
        BackendConfig {
            threads: args.threads.unwrap_or(0),
        },
    )?;
    let opts = ProfileOptions {
        name: args.name.clone(),
        max_age: std::time::Duration::from_secs_f64(args.max_age_h.max(0.0) * 3600.0),
        refresh: args.refresh,
    };
    let gpu = match args.gpu_backend.as_deref() {
        Some("none") => None,
        Some(name) => Some(name.to_string()),
        None => first_gpu_backend(),
    };
    let gpu = match gpu {
        Some(name) => Some(
            load_backend(Some(&name), BackendConfig { threads: 0 })
                .with_context(|| format!("the GPU backend '{name}'"))?,
        ),
        None => None,
    };
    if let Some(g) = gpu.as_ref().filter(|g| g.gpu_memory().is_none()) {
        eprintln!(
            "the backend '{}' reports no GPU memory: no GPU profiled",
            g.plugin_name
        );
    }
    let report = profile_with(&backend, gpu.as_ref(), &disk_file, &opts)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if args.toml {
        let file = DeviceProfiles {
            description: None,
            device: vec![report.profile],
        };
        print!("{}", toml::to_string(&file)?);
        return Ok(());
    }
    let p = &report.profile;
    let cores_from = match &report.cores.cgroup {
        Some(q) if q.whole_cores() < report.cores.affinity_cpus => format!(
            "quota {:.2} CPU ({} {}), {} CPUs in affinity",
            q.cores(),
            q.version.name(),
            q.path,
            report.cores.affinity_cpus
        ),
        _ => format!("{} CPUs in affinity", report.cores.affinity_cpus),
    };
    println!(
        "device      {} ({}, {} cores: {cores_from})",
        p.name,
        p.os.name(),
        p.cpu_cores
    );
    let rates: Vec<String> = QuantClass::ALL
        .iter()
        .map(|&q| format!("{} {:.0}", q.name(), p.cpu_gflops.flops_per_s(q) / 1e9))
        .collect();
    println!(
        "cpu GFLOP/s {}  (backend {})",
        rates.join(", "),
        backend.plugin_name
    );
    println!(
        "memory      read {:.1} GB/s, copy {:.1} GB/s",
        p.cpu_read_gb_s, p.memcpy_gb_s
    );
    println!(
        "RAM         {:.2} GiB total, {:.2} GiB available; swap {:.1} GiB, {:.1} GiB free",
        p.ram_total_gib, p.ram_available_gib, p.swap_total_gib, p.swap_available_gib
    );
    let host = &report.memory.host;
    match &report.memory.cgroup {
        Some(l) => println!(
            "            {:.2} GiB limit ({} {}), host {:.1} GiB total, {:.1} GiB available",
            l.limit_bytes as f64 / GIB,
            l.version.name(),
            l.path,
            host.total_gib,
            host.available_gib
        ),
        None => println!("            host figures (no cgroup memory limit below them)"),
    }
    println!(
        "disk        sequential {:.2} GB/s, random {:.2} GB/s ({}{})",
        p.disk_seq_gb_s,
        p.disk_rand_gb_s,
        report.disk_file.display(),
        if report.disk_uncached {
            ", page cache bypassed"
        } else {
            ", page cache NOT bypassed: this filesystem refuses direct I/O"
        }
    );
    match (&p.gpu_gflops, p.gpu, &gpu) {
        (Some(rates), kind, Some(g)) if kind != GpuKind::None => {
            let rates: Vec<String> = QuantClass::ALL
                .iter()
                .map(|&q| format!("{} {:.0}", q.name(), rates.flops_per_s(q) / 1e9))
                .collect();
            println!(
                "gpu GFLOP/s {}  (backend {}: {})",
                rates.join(", "),
                g.plugin_name,
                g.backend.describe()
            );
            println!(
                "gpu memory  {:.2} GiB available ({}), read {:.1} GB/s, one hidden state across the bus {:.3} ms",
                p.gpu_available_gib,
                if p.uma() { "unified memory" } else { "VRAM" },
                p.gpu_read_gb_s.unwrap_or(0.0),
                p.gpu_copy_ms
            );
        }
        _ => println!("gpu         none (no GPU backend plugin)"),
    }
    println!(
        "profiled in {:.0} ms ({}{})",
        report.elapsed_ms,
        if report.cached {
            "from cache"
        } else {
            "measured"
        },
        report
            .cache_file
            .as_ref()
            .map(|f| format!(", {}", f.display()))
            .unwrap_or_default()
    );
    Ok(())
}
