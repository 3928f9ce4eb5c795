//! Testbed files: the emulated home devices a `homelab up` builds, as TOML.
//!
//! Parsing and checking only — nothing here touches the machine. Every error names the
//! file and the field (and the device), never a panic.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use prima_cluster::manifest::Size;
use serde::Deserialize;

/// The longest device name: it becomes part of namespace and cgroup names.
const MAX_NAME_LEN: usize = 12;

/// A testbed as written in its file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestbedFile {
    testbed: Header,
    #[serde(rename = "device", default)]
    devices: Vec<DeviceFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    /// Defaults to the file's stem.
    name: Option<String>,
    /// The model every device runs (its own copy), unless a device names another.
    model: String,
    /// Context length for the generated manifest and commands.
    #[serde(default = "default_ctx")]
    ctx: usize,
}

fn default_ctx() -> usize {
    1024
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceFile {
    name: String,
    #[serde(default)]
    head: bool,
    memory: Size,
    cpu: f64,
    cpuset: Option<String>,
    disk_read: Option<Size>,
    link_mbit: Option<f64>,
    #[serde(default)]
    latency_ms: f64,
    threads: Option<u32>,
    mem_budget: Option<Size>,
    model: Option<String>,
}

/// One emulated device, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub name: String,
    pub head: bool,
    /// memory cgroup limit in bytes (page cache included).
    pub memory: u64,
    /// CFS quota as a fraction of one CPU (1.5 = one and a half cores).
    pub cpu: f64,
    /// cpuset.cpus, e.g. "0" or "0-1".
    pub cpuset: Option<String>,
    /// blkio read limit on the disk holding the model copies, bytes/s.
    pub disk_read: Option<u64>,
    /// Upload rate of the device's link (tbf), Mbit/s.
    pub link_mbit: Option<f64>,
    /// One-way latency of the device's link to the home router; a packet between two
    /// devices crosses both links.
    pub latency_ms: f64,
    pub threads: Option<u32>,
    /// The node's `--mem-budget` (the manifest's `mem_budget`).
    pub mem_budget: Option<u64>,
    /// The source of this device's model copy.
    pub model: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Testbed {
    pub name: String,
    pub ctx: usize,
    pub devices: Vec<Device>,
}

impl Testbed {
    /// Reads and checks a testbed file; relative model paths resolve from its directory.
    pub fn load(path: &Path) -> Result<Testbed> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = path.parent().unwrap_or(Path::new("."));
        parse(&text, &stem, dir).with_context(|| path.display().to_string())
    }

    /// Every device runs `model` instead of the file's choice (`--model`).
    pub fn override_model(&mut self, model: &Path) {
        for d in &mut self.devices {
            d.model = model.to_path_buf();
        }
    }

    /// Every device's link gets this one-way latency and/or upload rate instead of the
    /// file's (`--latency-ms`, `--link-mbit`), checked as the file's values are.
    pub fn override_links(
        &mut self,
        latency_ms: Option<f64>,
        link_mbit: Option<f64>,
    ) -> Result<()> {
        if let Some(ms) = latency_ms {
            check_latency(ms).context("--latency-ms")?;
        }
        if let Some(mbit) = link_mbit {
            check_link_mbit(mbit).context("--link-mbit")?;
        }
        for d in &mut self.devices {
            if let Some(ms) = latency_ms {
                d.latency_ms = ms;
            }
            if link_mbit.is_some() {
                d.link_mbit = link_mbit;
            }
        }
        Ok(())
    }
}

/// Parses testbed text; `stem` is the default name and `dir` where relative paths start.
pub fn parse(text: &str, stem: &str, dir: &Path) -> Result<Testbed> {
    // toml's message spans lines (a caret under the column); keep it on one.
    let file: TestbedFile = toml::from_str(text)
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().replace('\n', " ").trim()))?;
    let name = file.testbed.name.unwrap_or_else(|| stem.to_string());
    check_name("testbed.name", &name, 32)?;
    if file.testbed.ctx < 16 {
        bail!(
            "testbed.ctx: {} is too small (at least 16)",
            file.testbed.ctx
        );
    }
    if file.devices.is_empty() {
        bail!("no [[device]]: a testbed needs at least one");
    }
    let default_model = resolve(dir, &file.testbed.model);
    let mut devices = Vec::with_capacity(file.devices.len());
    for d in file.devices {
        let at = |field: &str| format!("device '{}': {field}", d.name);
        check_name("device.name", &d.name, MAX_NAME_LEN)?;
        if devices.iter().any(|o: &Device| o.name == d.name) {
            bail!("device '{}' is declared twice", d.name);
        }
        if d.memory.0 < 16 << 20 {
            bail!("{}: {} bytes is below 16M", at("memory"), d.memory.0);
        }
        if !(d.cpu.is_finite() && d.cpu >= 0.01 && d.cpu <= 1024.0) {
            bail!("{}: {} is not a CPU share (0.01 to 1024)", at("cpu"), d.cpu);
        }
        if let Some(set) = &d.cpuset {
            check_cpuset(set).with_context(|| at("cpuset"))?;
        }
        if let Some(rate) = d.disk_read {
            if rate.0 < 1 << 20 {
                bail!("{}: {} bytes/s is below 1M/s", at("disk_read"), rate.0);
            }
        }
        if let Some(mbit) = d.link_mbit {
            check_link_mbit(mbit).with_context(|| at("link_mbit"))?;
        }
        check_latency(d.latency_ms).with_context(|| at("latency_ms"))?;
        if d.threads == Some(0) {
            bail!("{}: must be at least 1", at("threads"));
        }
        devices.push(Device {
            head: d.head,
            memory: d.memory.0,
            cpu: d.cpu,
            cpuset: d.cpuset,
            disk_read: d.disk_read.map(|s| s.0),
            link_mbit: d.link_mbit,
            latency_ms: d.latency_ms,
            threads: d.threads,
            mem_budget: d.mem_budget.map(|s| s.0),
            model: d
                .model
                .as_deref()
                .map(|m| resolve(dir, m))
                .unwrap_or_else(|| default_model.clone()),
            name: d.name,
        });
    }
    match devices.iter().filter(|d| d.head).count() {
        1 => {}
        0 => bail!("no device has head = true (exactly one must)"),
        n => bail!("{n} devices have head = true (exactly one must)"),
    }
    if devices.len() > 200 {
        bail!("{} devices: at most 200 fit the bed's /24", devices.len());
    }
    Ok(Testbed {
        name,
        ctx: file.testbed.ctx,
        devices,
    })
}

/// Names become parts of namespace, cgroup and file names: keep them plain.
fn check_link_mbit(mbit: f64) -> Result<()> {
    if !(mbit.is_finite() && (0.1..=100_000.0).contains(&mbit)) {
        bail!("{mbit} is not a rate (0.1 to 100000 Mbit/s)");
    }
    Ok(())
}

fn check_latency(ms: f64) -> Result<()> {
    if !(ms.is_finite() && (0.0..=10_000.0).contains(&ms)) {
        bail!("{ms} is not a latency (0 to 10000 ms)");
    }
    Ok(())
}

fn check_name(field: &str, name: &str, max: usize) -> Result<()> {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if name.is_empty() || name.len() > max || !plain || name.starts_with('-') {
        bail!("{field}: '{name}' must be 1 to {max} characters of a-z, 0-9 and '-'");
    }
    Ok(())
}

/// A cpuset list as the kernel writes it: "0", "0-1", "0,2-3".
fn check_cpuset(set: &str) -> Result<()> {
    let ok = !set.is_empty()
        && set.split(',').all(|part| {
            let mut ends = part.splitn(2, '-').map(|n| n.trim().parse::<u32>());
            match (ends.next(), ends.next()) {
                (Some(Ok(_)), None) => true,
                (Some(Ok(a)), Some(Ok(b))) => a <= b,
                _ => false,
            }
        });
    if !ok {
        bail!("'{set}' is not a CPU list (e.g. \"0\", \"0-1\", \"0,2\")");
    }
    Ok(())
}

/// `~/` is the home directory; other relative paths start at the testbed's directory.
fn resolve(dir: &Path, path: &str) -> PathBuf {
    if let Some(rest) = path.strip_prefix("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    dir.join(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        [testbed]
        model = "m.gguf"
        [[device]]
        name = "d1"
        head = true
        memory = "600M"
        cpu = 0.5
        cpuset = "0"
        disk_read = "200M"
        link_mbit = 100
        latency_ms = 3
        [[device]]
        name = "d2"
        memory = 104857600
        cpu = 1
        model = "~/other.gguf"
    "#;

    fn err(text: &str) -> String {
        format!("{:#}", parse(text, "bed", Path::new("/beds")).unwrap_err())
    }

    fn with(device_line: &str) -> String {
        GOOD.replace("latency_ms = 3", device_line)
    }

    #[test]
    fn a_good_testbed_parses() {
        let bed = parse(GOOD, "bed", Path::new("/beds")).unwrap();
        assert_eq!(bed.name, "bed");
        assert_eq!(bed.devices.len(), 2);
        let d1 = &bed.devices[0];
        assert_eq!(d1.memory, 600 << 20);
        assert_eq!(d1.disk_read, Some(200 << 20));
        assert_eq!(d1.link_mbit, Some(100.0));
        assert_eq!(d1.model, Path::new("/beds/m.gguf"));
        assert!(bed.devices[0].head && !bed.devices[1].head);
        assert_eq!(bed.devices[1].memory, 100 << 20);
        assert!(bed.devices[1].model.ends_with("other.gguf"));
        assert!(!bed.devices[1].model.starts_with("~"));
    }

    #[test]
    fn bad_values_name_their_field() {
        let e = err(&GOOD.replace(r#"memory = "600M""#, r#"memory = "6 bananas""#));
        assert!(e.contains("bananas"), "{e}");
        let e = err(&GOOD.replace(r#"memory = "600M""#, r#"memory = "1M""#));
        assert!(e.contains("device 'd1': memory"), "{e}");
        let e = err(&GOOD.replace("cpu = 0.5", "cpu = -1"));
        assert!(e.contains("device 'd1': cpu"), "{e}");
        let e = err(&GOOD.replace(r#"cpuset = "0""#, r#"cpuset = "2-1""#));
        assert!(e.contains("device 'd1': cpuset"), "{e}");
        let e = err(&with("latency_ms = -3"));
        assert!(e.contains("device 'd1': latency_ms"), "{e}");
        let e = err(&GOOD.replace("link_mbit = 100", "link_mbit = 0"));
        assert!(e.contains("device 'd1': link_mbit"), "{e}");
        let e = err(&GOOD.replace(r#"disk_read = "200M""#, r#"disk_read = "1K""#));
        assert!(e.contains("device 'd1': disk_read"), "{e}");
        let e = err(&with("threads = 0"));
        assert!(e.contains("device 'd1': threads"), "{e}");
    }

    #[test]
    fn link_overrides_apply_to_every_device_and_are_checked() {
        let mut bed = parse(GOOD, "bed", Path::new("/beds")).unwrap();
        bed.override_links(Some(20.0), Some(300.0)).unwrap();
        assert!(bed
            .devices
            .iter()
            .all(|d| d.latency_ms == 20.0 && d.link_mbit == Some(300.0)));
        bed.override_links(Some(1.0), None).unwrap();
        assert!(bed.devices.iter().all(|d| d.link_mbit == Some(300.0)));
        let e = format!("{:#}", bed.override_links(Some(-1.0), None).unwrap_err());
        assert!(e.contains("--latency-ms"), "{e}");
        assert!(bed.override_links(None, Some(0.0)).is_err());
        assert!(bed.devices.iter().all(|d| d.latency_ms == 1.0));
    }

    #[test]
    fn unknown_fields_and_missing_fields_are_errors() {
        let e = err(&with("colour = \"red\""));
        assert!(e.contains("colour"), "{e}");
        let e = err(&GOOD.replace("cpu = 1\n", ""));
        assert!(e.contains("cpu"), "{e}");
        let e = err("[[device]]\nname = \"a\"");
        assert!(e.contains("missing field"), "{e}");
    }

    #[test]
    fn head_and_names_are_checked() {
        let e = err(&GOOD.replace("head = true", ""));
        assert!(e.contains("head"), "{e}");
        let e = err(&GOOD.replace(r#"name = "d2""#, "name = \"d2\"\nhead = true"));
        assert!(e.contains("2 devices have head"), "{e}");
        let e = err(&GOOD.replace(r#"name = "d2""#, r#"name = "d1""#));
        assert!(e.contains("declared twice"), "{e}");
        let e = err(&GOOD.replace(r#"name = "d2""#, r#"name = "D 2""#));
        assert!(e.contains("device.name"), "{e}");
        let e = err(&GOOD.replace(r#"name = "d2""#, r#"name = "a-very-long-device""#));
        assert!(e.contains("device.name"), "{e}");
        assert!(err("").contains("testbed"));
        assert!(err("[testbed]\nmodel = \"m\"\n").contains("no [[device]]"));
    }

    #[test]
    fn the_committed_testbeds_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/testbeds/homelab");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let bed = Testbed::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
                assert_eq!(bed.name, path.file_stem().unwrap().to_string_lossy());
                seen += 1;
            }
        }
        assert!(
            seen >= 3,
            "expected the three home-lab testbeds in {}",
            dir.display()
        );
    }
}
