//! What Halda needs to know about one device: the record the profiler fills in on this
//! machine and the testbed fixtures (`manifests/testbeds/*.toml`) write by hand.
//!
//! Units are in the field names so a profile file reads without a manual: capacities in
//! GiB (`_gib`), throughputs in 10⁹ units per second (`_gb_s`, `gflops`), times in
//! milliseconds (`_ms`). Unknown fields are refused, so a typo is an error naming the
//! field rather than a silently ignored value.

use serde::{Deserialize, Serialize};

use prima_core::gguf::GgmlType;

pub use prima_host::{GB, GIB};

/// The operating system by name (`linux`, `macos`, `android`, `windows`, …), which decides
/// how mmapped weights are reclaimed and reloaded (the paper's sets M1–M3): an OS memory
/// plugin covering the name says how (see `crate::halda::os`), so any name a plugin covers
/// is a valid OS without rebuilding `prima`. Names are interned, so an `Os` stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Os(&'static str);

#[allow(non_upper_case_globals)]
impl Os {
    pub const Linux: Os = Os("linux");
    pub const Macos: Os = Os("macos");
    pub const Android: Os = Os("android");

    /// The OS called `name`.
    pub fn named(name: &str) -> Os {
        use std::collections::HashSet;
        use std::sync::{Mutex, OnceLock};
        for known in [Os::Linux, Os::Macos, Os::Android] {
            if known.0 == name {
                return known;
            }
        }
        // Each distinct name is leaked once: a handful per process.
        static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
        let mut names = NAMES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(&interned) = names.get(name) {
            return Os(interned);
        }
        let interned: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.insert(interned);
        Os(interned)
    }

    /// The OS this binary was built for, named as Rust names it (`std::env::consts::OS`).
    pub fn current() -> Os {
        Os::named(std::env::consts::OS)
    }

    pub fn name(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Debug for Os {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for Os {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Os {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Os, D::Error> {
        let name = String::deserialize(d)?;
        let valid = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-_.".contains(&c));
        if !valid {
            return Err(serde::de::Error::custom(format!(
                "os = {name:?}: expected an OS name in lower case (linux, macos, android, windows, or one an OS memory plugin covers)"
            )));
        }
        Ok(Os::named(&name))
    }
}

/// The GPU backend a device runs its GPU layers with, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuKind {
    #[default]
    None,
    /// Private VRAM, locked by the driver (never paged).
    Cuda,
    /// Apple unified memory shared with the CPU.
    Metal,
}

/// The six weight-format classes the paper's FLOP counts and throughputs are kept for
/// (its set 𝒬). Other GGUF types are counted in the nearest class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantClass {
    Q4K,
    Q5K,
    Q6K,
    Q80,
    F16,
    F32,
}

impl QuantClass {
    pub const ALL: [QuantClass; 6] = [
        QuantClass::Q4K,
        QuantClass::Q5K,
        QuantClass::Q6K,
        QuantClass::Q80,
        QuantClass::F16,
        QuantClass::F32,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantClass::Q4K => "q4_k",
            QuantClass::Q5K => "q5_k",
            QuantClass::Q6K => "q6_k",
            QuantClass::Q80 => "q8_0",
            QuantClass::F16 => "f16",
            QuantClass::F32 => "f32",
        }
    }

    /// The GGUF type the profiler measures this class with.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            QuantClass::Q4K => GgmlType::Q4K,
            QuantClass::Q5K => GgmlType::Q5K,
            QuantClass::Q6K => GgmlType::Q6K,
            QuantClass::Q80 => GgmlType::Q8_0,
            QuantClass::F16 => GgmlType::F16,
            QuantClass::F32 => GgmlType::F32,
        }
    }

    /// The class a GGUF type's FLOPs are counted in.
    pub fn of(t: GgmlType) -> QuantClass {
        match t {
            GgmlType::Q4K | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q2K | GgmlType::Q3K => {
                QuantClass::Q4K
            }
            GgmlType::IQ4NL | GgmlType::IQ4XS | GgmlType::MXFP4 => QuantClass::Q4K,
            GgmlType::Q5K | GgmlType::Q5_0 | GgmlType::Q5_1 => QuantClass::Q5K,
            GgmlType::Q6K => QuantClass::Q6K,
            GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8K => QuantClass::Q80,
            GgmlType::F16 | GgmlType::BF16 => QuantClass::F16,
            GgmlType::F32 => QuantClass::F32,
        }
    }
}

/// Throughput per weight-format class, in GFLOP/s (the paper's s_m^{cpu,q}, s_m^{gpu,q}).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantRates {
    pub q4_k: f64,
    pub q5_k: f64,
    pub q6_k: f64,
    pub q8_0: f64,
    pub f16: f64,
    pub f32: f64,
}

impl QuantRates {
    /// The same rate for every class.
    pub fn uniform(gflops: f64) -> QuantRates {
        QuantRates {
            q4_k: gflops,
            q5_k: gflops,
            q6_k: gflops,
            q8_0: gflops,
            f16: gflops,
            f32: gflops,
        }
    }

    /// FLOP/s of one class.
    pub fn flops_per_s(&self, q: QuantClass) -> f64 {
        GB * match q {
            QuantClass::Q4K => self.q4_k,
            QuantClass::Q5K => self.q5_k,
            QuantClass::Q6K => self.q6_k,
            QuantClass::Q80 => self.q8_0,
            QuantClass::F16 => self.f16,
            QuantClass::F32 => self.f32,
        }
    }

    pub fn set(&mut self, q: QuantClass, gflops: f64) {
        *match q {
            QuantClass::Q4K => &mut self.q4_k,
            QuantClass::Q5K => &mut self.q5_k,
            QuantClass::Q6K => &mut self.q6_k,
            QuantClass::Q80 => &mut self.q8_0,
            QuantClass::F16 => &mut self.f16,
            QuantClass::F32 => &mut self.f32,
        } = gflops;
    }

    fn check(&self, field: &str) -> Result<(), String> {
        for q in QuantClass::ALL {
            let v = self.flops_per_s(q);
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{field}.{} must be a positive number", q.name()));
            }
        }
        Ok(())
    }
}

/// Round-trip time and throughput to the next device in the ring, measured by the ring
/// for messages of 4e bytes (one hidden state in f32).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkProfile {
    pub rtt_ms: f64,
    pub bytes_per_s: f64,
}

/// One device, as Halda plans with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    pub name: String,
    pub os: Os,
    #[serde(default)]
    pub gpu: GpuKind,
    #[serde(default)]
    pub cpu_cores: u32,
    /// s_m^{cpu,q}: CPU matmul throughput per weight class (cache-resident, so compute only).
    pub cpu_gflops: QuantRates,
    /// The share of its cores a CPU quota (a cgroup's CFS quota) leaves the device, when
    /// below 1. `cpu_gflops` are scaled by it; but a ring device idles between its turns,
    /// so a turn runs at the unscaled rate while its CPU time fits the quota's period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota_share: Option<f64>,
    /// s_m^{gpu,q}: GPU throughput per weight class (CUDA or Metal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_gflops: Option<QuantRates>,
    /// 𝒯_m^{cpu}: rate at which the CPU reads weights and KV from RAM into registers.
    pub cpu_read_gb_s: f64,
    /// 𝒯_m^{gpu}: the same from VRAM (or unified memory) into the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_read_gb_s: Option<f64>,
    /// Copy rate of small buffers in RAM, giving t_m^{kv_cpy,cpu} (and in VRAM for the GPU).
    pub memcpy_gb_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memcpy_gb_s: Option<f64>,
    /// t_m^{ram-vram} (= t_m^{vram-ram}): one copy of a 4e-byte hidden state across the bus.
    #[serde(default)]
    pub gpu_copy_ms: f64,
    pub ram_total_gib: f64,
    /// d_m^{avail}: MemAvailable (free plus reclaimable), not MemFree.
    pub ram_available_gib: f64,
    #[serde(default)]
    pub swap_total_gib: f64,
    /// d_m^{swap_avail}.
    #[serde(default)]
    pub swap_available_gib: f64,
    /// d_m^{bytes_can_swap}: memory of other apps Android may swap out for us.
    #[serde(default)]
    pub swappable_gib: f64,
    /// d_{m,cuda}^{avail} for CUDA, d_{m,metal}^{avail} (Metal's recommended working set,
    /// bounded by available RAM) for Metal.
    #[serde(default)]
    pub gpu_available_gib: f64,
    /// Sequential read throughput of the disk holding the model (Linux and Android reloads).
    pub disk_seq_gb_s: f64,
    /// Random read throughput (macOS reloads).
    pub disk_rand_gb_s: f64,
    /// Filled by the ring once it has measured the link; absent until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkProfile>,
    /// The device is a needed hop of the ring: if pruned it stays as a relay without layers.
    #[serde(default)]
    pub relay: bool,
}

impl DeviceProfile {
    pub fn has_gpu(&self) -> bool {
        self.gpu != GpuKind::None
    }

    /// Unified memory: CPU and GPU share RAM, so no copy crosses a bus (𝕀_m^{UMA}).
    pub fn uma(&self) -> bool {
        self.gpu == GpuKind::Metal
    }

    /// Checks that every number a plan divides by is positive and every capacity sane;
    /// the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |field: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{field} = {v} must be a positive number"))
            }
        };
        let non_negative = |field: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{field} = {v} must be zero or positive"))
            }
        };
        if self.name.trim().is_empty() {
            return Err("name must not be empty".into());
        }
        self.cpu_gflops.check("cpu_gflops")?;
        positive("cpu_read_gb_s", self.cpu_read_gb_s)?;
        positive("memcpy_gb_s", self.memcpy_gb_s)?;
        positive("ram_total_gib", self.ram_total_gib)?;
        non_negative("ram_available_gib", self.ram_available_gib)?;
        if self.ram_available_gib > self.ram_total_gib {
            return Err(format!(
                "ram_available_gib = {} exceeds ram_total_gib = {}",
                self.ram_available_gib, self.ram_total_gib
            ));
        }
        non_negative("swap_total_gib", self.swap_total_gib)?;
        non_negative("swap_available_gib", self.swap_available_gib)?;
        non_negative("swappable_gib", self.swappable_gib)?;
        non_negative("gpu_copy_ms", self.gpu_copy_ms)?;
        positive("disk_seq_gb_s", self.disk_seq_gb_s)?;
        positive("disk_rand_gb_s", self.disk_rand_gb_s)?;
        if self.gpu == GpuKind::Metal && self.os != Os::Macos {
            return Err("gpu = \"metal\" needs os = \"macos\"".into());
        }
        if self.has_gpu() {
            match &self.gpu_gflops {
                Some(r) => r.check("gpu_gflops")?,
                None => {
                    return Err(format!("gpu = \"{:?}\" needs gpu_gflops", self.gpu).to_lowercase())
                }
            }
            positive(
                "gpu_read_gb_s",
                self.gpu_read_gb_s
                    .ok_or_else(|| "a GPU device needs gpu_read_gb_s".to_string())?,
            )?;
            positive("gpu_available_gib", self.gpu_available_gib)?;
            if let Some(v) = self.gpu_memcpy_gb_s {
                positive("gpu_memcpy_gb_s", v)?;
            }
        } else if self.gpu_gflops.is_some() || self.gpu_read_gb_s.is_some() {
            return Err("gpu_gflops / gpu_read_gb_s given but gpu = \"none\"".into());
        }
        if let Some(share) = self.cpu_quota_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(format!("cpu_quota_share must be in (0, 1], not {share}"));
            }
        }
        if let Some(link) = &self.link {
            non_negative("link.rtt_ms", link.rtt_ms)?;
            positive("link.bytes_per_s", link.bytes_per_s)?;
        }
        Ok(())
    }
}

/// A set of devices in ring order; the first is the head (it holds the input and output
/// layers). The file form of `prima plan --devices`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfiles {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub device: Vec<DeviceProfile>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfilesError {
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("{path}: device '{device}': {message}")]
    Invalid {
        path: std::path::PathBuf,
        device: String,
        message: String,
    },
}

impl DeviceProfiles {
    /// Reads and validates a profiles TOML file; every error names the file, and the
    /// device and field where there is one.
    pub fn load(path: &std::path::Path) -> Result<DeviceProfiles, ProfilesError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfilesError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        DeviceProfiles::parse(path, &text)
    }

    pub fn parse(path: &std::path::Path, text: &str) -> Result<DeviceProfiles, ProfilesError> {
        let profiles: DeviceProfiles = toml::from_str(text).map_err(|e| ProfilesError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        if profiles.device.is_empty() {
            return Err(ProfilesError::Parse {
                path: path.to_path_buf(),
                message: "no [[device]] entries".into(),
            });
        }
        for (i, d) in profiles.device.iter().enumerate() {
            d.validate().map_err(|message| ProfilesError::Invalid {
                path: path.to_path_buf(),
                device: d.name.clone(),
                message,
            })?;
            if profiles.device[..i].iter().any(|o| o.name == d.name) {
                return Err(ProfilesError::Invalid {
                    path: path.to_path_buf(),
                    device: d.name.clone(),
                    message: "duplicate device name".into(),
                });
            }
        }
        Ok(profiles)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const ONE: &str = r#"
[[device]]
name = "a"
os = "linux"
cpu_gflops = { q4_k = 1, q5_k = 1, q6_k = 1, q8_0 = 1, f16 = 1, f32 = 1 }
cpu_read_gb_s = 10
memcpy_gb_s = 10
ram_total_gib = 8
ram_available_gib = 4
disk_seq_gb_s = 1
disk_rand_gb_s = 0.5
"#;

    #[test]
    fn parses_a_minimal_device_with_defaults() {
        let p = DeviceProfiles::parse(Path::new("x.toml"), ONE).unwrap();
        assert_eq!(p.device.len(), 1);
        assert_eq!(p.device[0].gpu, GpuKind::None);
        assert!(p.device[0].link.is_none() && !p.device[0].relay);
    }

    #[test]
    fn errors_name_the_file_device_and_field() {
        let e = DeviceProfiles::parse(
            Path::new("x.toml"),
            &ONE.replace("os = \"linux\"", "os = \"linux\"\nfoo = 1"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("x.toml") && e.contains("foo"), "{e}");
        let e = DeviceProfiles::parse(
            Path::new("x.toml"),
            &ONE.replace("ram_available_gib = 4", "ram_available_gib = 9"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("device 'a'") && e.contains("ram_available_gib"),
            "{e}"
        );
        let e = DeviceProfiles::parse(
            Path::new("x.toml"),
            &ONE.replace("os = \"linux\"", "os = \"linux\"\ngpu = \"metal\""),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("metal"), "{e}");
        let twice = format!("{ONE}{}", ONE.replace("[[device]]", "\n[[device]]"));
        let e = DeviceProfiles::parse(Path::new("x.toml"), &twice)
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate"), "{e}");
    }

    #[test]
    fn any_lower_case_os_name_parses_and_round_trips() {
        let p = DeviceProfiles::parse(
            Path::new("x.toml"),
            &ONE.replace("os = \"linux\"", "os = \"windows\""),
        )
        .unwrap();
        assert_eq!(p.device[0].os, Os::named("windows"));
        assert_eq!(p.device[0].os.name(), "windows");
        assert_eq!(Os::named("linux"), Os::Linux);
        let text = toml::to_string(&p.device[0]).unwrap();
        assert!(text.contains("os = \"windows\""), "{text}");
        let e = DeviceProfiles::parse(
            Path::new("x.toml"),
            &ONE.replace("os = \"linux\"", "os = \"Windows 11\""),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("x.toml") && e.contains("Windows 11"), "{e}");
    }

    #[test]
    fn every_gguf_type_has_a_class() {
        for t in GgmlType::ALL {
            let q = QuantClass::of(t);
            assert!(QuantClass::ALL.contains(&q));
        }
        for q in QuantClass::ALL {
            assert_eq!(QuantClass::of(q.ggml_type()), q);
        }
    }
}
