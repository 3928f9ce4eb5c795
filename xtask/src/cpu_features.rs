//! The CPU the reference tools will run on, read from `/proc/cpuinfo`, and the llama.cpp
//! (ggml) cmake switches that build for exactly that CPU.
//!
//! ggml's own `GGML_NATIVE=ON` would use `-march=native`, which turns on AMX wherever the
//! CPU advertises it — and AMX is advertised but faults on some of the machines this
//! project runs on. So the build is portable (`GGML_NATIVE=OFF`) and every instruction-set
//! switch is set explicitly from the features the kernel reports, ON or OFF: with
//! `GGML_NATIVE=OFF` ggml turns SSE4.2, AVX, AVX2, BMI2, FMA and F16C on by default, which
//! would die with SIGILL on an older CPU. AMX is always off.
//!
//! `PRIMA_REFERENCE_CPUINFO=FILE` reads another machine's recorded `/proc/cpuinfo`
//! instead, to build reference tools for (and emulate) a smaller CPU.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

/// The environment variable that points at a recorded `/proc/cpuinfo`.
pub const CPUINFO_OVERRIDE: &str = "PRIMA_REFERENCE_CPUINFO";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
    /// Anything else: ggml's portable defaults, no instruction-set switches.
    Other,
}

impl Arch {
    pub fn host() -> Arch {
        match std::env::consts::ARCH {
            "x86_64" => Arch::X86_64,
            "aarch64" => Arch::Aarch64,
            _ => Arch::Other,
        }
    }
}

/// The features every logical CPU reports (their intersection, so a hybrid CPU whose
/// small cores lack an extension is built for the small cores).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuFeatures {
    pub arch: Arch,
    flags: BTreeSet<String>,
}

/// x86-64: ggml switch ← every `/proc/cpuinfo` flag it needs. The AVX-512 extensions
/// also need ggml's base `GGML_AVX512` ([`AVX512_BASE`]).
const X86_SWITCHES: &[(&str, &[&str])] = &[
    ("GGML_SSE42", &["sse4_2"]),
    ("GGML_AVX", &["avx"]),
    ("GGML_AVX2", &["avx2"]),
    ("GGML_FMA", &["fma"]),
    ("GGML_F16C", &["f16c"]),
    ("GGML_BMI2", &["bmi2"]),
    ("GGML_AVX_VNNI", &["avx_vnni", "avx2"]),
    ("GGML_AVX512", AVX512_BASE),
];
/// ggml's `GGML_AVX512` compiles for all five of these at once.
const AVX512_BASE: &[&str] = &["avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"];
const X86_AVX512_EXTENSIONS: &[(&str, &str)] = &[
    ("GGML_AVX512_VBMI", "avx512vbmi"),
    ("GGML_AVX512_VNNI", "avx512_vnni"),
    ("GGML_AVX512_BF16", "avx512_bf16"),
];
/// Advertised by some CPUs here, faults when used: never built.
const X86_NEVER: &[&str] = &["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"];

impl CpuFeatures {
    /// This machine's CPU (or the recorded one `PRIMA_REFERENCE_CPUINFO` names).
    pub fn detect() -> Result<CpuFeatures> {
        let (path, arch) = match std::env::var_os(CPUINFO_OVERRIDE) {
            Some(p) => (PathBuf::from(p), None),
            None => (PathBuf::from("/proc/cpuinfo"), Some(Arch::host())),
        };
        if arch == Some(Arch::Other) {
            return CpuFeatures::parse(Arch::Other, "");
        }
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let arch = arch.unwrap_or_else(|| guess_arch(&text));
        CpuFeatures::parse(arch, &text).with_context(|| format!("in {}", path.display()))
    }

    /// The features in a `/proc/cpuinfo` text: `flags` lines on x86-64, `Features` on
    /// aarch64, intersected over the processors listed.
    pub fn parse(arch: Arch, cpuinfo: &str) -> Result<CpuFeatures> {
        let key = match arch {
            Arch::X86_64 => "flags",
            Arch::Aarch64 => "Features",
            Arch::Other => {
                return Ok(CpuFeatures {
                    arch,
                    flags: BTreeSet::new(),
                })
            }
        };
        let mut common: Option<BTreeSet<String>> = None;
        for line in cpuinfo.lines() {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.trim() != key {
                continue;
            }
            let these: BTreeSet<String> = value.split_whitespace().map(str::to_owned).collect();
            common = Some(match common {
                None => these,
                Some(c) => c.intersection(&these).cloned().collect(),
            });
        }
        let Some(flags) = common else {
            bail!("no `{key}` line: not a /proc/cpuinfo of an {arch:?} machine");
        };
        Ok(CpuFeatures { arch, flags })
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.contains(flag)
    }

    fn has_all(&self, flags: &[&str]) -> bool {
        flags.iter().all(|f| self.has(f))
    }

    /// ggml's cmake switches for this CPU: `-DGGML_NATIVE=OFF` and every instruction-set
    /// switch ON or OFF.
    pub fn cmake_flags(&self) -> Vec<String> {
        let mut out = vec!["-DGGML_NATIVE=OFF".to_owned()];
        let mut set = |name: &str, on: bool| {
            out.push(format!("-D{name}={}", if on { "ON" } else { "OFF" }));
        };
        match self.arch {
            Arch::X86_64 => {
                for (switch, needs) in X86_SWITCHES {
                    set(switch, self.has_all(needs));
                }
                let avx512 = self.has_all(AVX512_BASE);
                for (switch, flag) in X86_AVX512_EXTENSIONS {
                    set(switch, avx512 && self.has(flag));
                }
                for switch in X86_NEVER {
                    set(switch, false);
                }
            }
            Arch::Aarch64 => out.push(format!("-DGGML_CPU_ARM_ARCH={}", self.arm_march())),
            Arch::Other => {}
        }
        out
    }

    /// `-march` for aarch64: Armv8.2-A with the dot-product and half-precision
    /// extensions where the CPU has them, plain Armv8-A otherwise (SVE stays off: its
    /// vector length is the machine's, not the build's).
    fn arm_march(&self) -> String {
        let dotprod = self.has("asimddp");
        let fp16 = self.has_all(&["fphp", "asimdhp"]);
        let i8mm = self.has("i8mm");
        if !(dotprod || fp16 || i8mm) {
            return "armv8-a".to_owned();
        }
        let mut march = "armv8.2-a".to_owned();
        for (on, ext) in [(dotprod, "+dotprod"), (fp16, "+fp16"), (i8mm, "+i8mm")] {
            if on {
                march.push_str(ext);
            }
        }
        march
    }

    /// A one-line account for logs and stamps: the switches that are ON.
    pub fn summary(&self) -> String {
        let on: Vec<String> = self
            .cmake_flags()
            .iter()
            .filter_map(|f| {
                let f = f.strip_prefix("-D")?;
                if let Some(name) = f.strip_suffix("=ON") {
                    Some(name.trim_start_matches("GGML_").to_lowercase())
                } else {
                    f.strip_prefix("GGML_CPU_ARM_ARCH=").map(str::to_owned)
                }
            })
            .collect();
        format!("{:?}: {}", self.arch, on.join(" "))
    }
}

/// The architecture a recorded cpuinfo comes from (x86 lists `flags`, aarch64 `Features`).
fn guess_arch(cpuinfo: &str) -> Arch {
    let has_key = |key: &str| {
        cpuinfo
            .lines()
            .any(|l| l.split_once(':').is_some_and(|(k, _)| k.trim() == key))
    };
    if has_key("flags") {
        Arch::X86_64
    } else if has_key("Features") {
        Arch::Aarch64
    } else {
        Arch::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> CpuFeatures {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/cpuinfo")
            .join(name);
        let text = fs::read_to_string(&path).unwrap();
        CpuFeatures::parse(guess_arch(&text), &text).unwrap()
    }

    fn switch(f: &CpuFeatures, name: &str) -> Option<String> {
        let prefix = format!("-D{name}=");
        f.cmake_flags()
            .iter()
            .find_map(|s| s.strip_prefix(&prefix).map(str::to_owned))
    }

    #[test]
    fn avx2_only_cpu_gets_no_avx512() {
        let f = sample("amd-epyc-zen3-avx2.txt");
        assert_eq!(f.arch, Arch::X86_64);
        for on in [
            "GGML_SSE42",
            "GGML_AVX",
            "GGML_AVX2",
            "GGML_FMA",
            "GGML_F16C",
            "GGML_BMI2",
        ] {
            assert_eq!(switch(&f, on).as_deref(), Some("ON"), "{on}");
        }
        for off in [
            "GGML_AVX_VNNI",
            "GGML_AVX512",
            "GGML_AVX512_VBMI",
            "GGML_AVX512_VNNI",
            "GGML_AVX512_BF16",
            "GGML_AMX_TILE",
            "GGML_AMX_INT8",
            "GGML_AMX_BF16",
        ] {
            assert_eq!(switch(&f, off).as_deref(), Some("OFF"), "{off}");
        }
        assert_eq!(switch(&f, "GGML_NATIVE").as_deref(), Some("OFF"));
    }

    #[test]
    fn avx512_cpu_gets_avx512_and_its_extensions_but_never_amx() {
        let f = sample("intel-sapphire-rapids-avx512-amx.txt");
        assert!(f.has("amx_int8"), "the sample advertises AMX");
        for on in [
            "GGML_AVX2",
            "GGML_AVX_VNNI",
            "GGML_AVX512",
            "GGML_AVX512_VBMI",
            "GGML_AVX512_VNNI",
            "GGML_AVX512_BF16",
        ] {
            assert_eq!(switch(&f, on).as_deref(), Some("ON"), "{on}");
        }
        for off in ["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"] {
            assert_eq!(switch(&f, off).as_deref(), Some("OFF"), "{off}");
        }
        assert!(f.summary().contains("avx512_vnni"), "{}", f.summary());
        assert!(!f.summary().contains("amx"), "{}", f.summary());
    }

    #[test]
    fn a_missing_avx512_part_turns_off_the_base_and_every_extension() {
        let text = fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/cpuinfo/intel-sapphire-rapids-avx512-amx.txt"),
        )
        .unwrap()
        .replace(" avx512bw", "");
        let f = CpuFeatures::parse(Arch::X86_64, &text).unwrap();
        for off in ["GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI"] {
            assert_eq!(switch(&f, off).as_deref(), Some("OFF"), "{off}");
        }
    }

    #[test]
    fn processors_that_differ_are_intersected() {
        let text = "processor : 0\nflags : avx avx2 fma\n\nprocessor : 1\nflags : avx fma\n";
        let f = CpuFeatures::parse(Arch::X86_64, text).unwrap();
        assert_eq!(switch(&f, "GGML_AVX2").as_deref(), Some("OFF"));
        assert_eq!(switch(&f, "GGML_FMA").as_deref(), Some("ON"));
    }

    #[test]
    fn aarch64_with_and_without_dotprod() {
        let n1 = sample("arm-neoverse-n1-dotprod.txt");
        assert_eq!(n1.arch, Arch::Aarch64);
        assert_eq!(
            switch(&n1, "GGML_CPU_ARM_ARCH").as_deref(),
            Some("armv8.2-a+dotprod+fp16")
        );
        let a53 = sample("arm-cortex-a53-neon.txt");
        assert_eq!(
            switch(&a53, "GGML_CPU_ARM_ARCH").as_deref(),
            Some("armv8-a")
        );
        assert!(!n1.cmake_flags().iter().any(|f| f.contains("AVX")));
    }

    #[test]
    fn a_file_that_is_not_cpuinfo_is_named() {
        let err = CpuFeatures::parse(Arch::X86_64, "hello\n").unwrap_err();
        assert!(err.to_string().contains("no `flags` line"), "{err}");
    }

    #[test]
    fn this_machine_is_readable() {
        // Whatever the CPU, detection must work and never build AMX.
        let f = CpuFeatures::detect().unwrap();
        assert!(!f.summary().contains("amx"), "{}", f.summary());
    }
}
