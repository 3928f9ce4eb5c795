//! llama.cpp, the reference implementation: its source (vendored in the
//! llama-cpp-python sdist on PyPI), a CPU build in `~/.cache/prima/llama.cpp/build`,
//! and our own logits dump tool linked against that build.
//!
//! Nothing here is committed: source, build and binaries stay in the cache.
//! The build is skipped when its binaries exist and its stamp (sdist version,
//! cmake flags, targets) matches this file.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

use crate::build_tools;
use crate::cpu_features::CpuFeatures;
use crate::layout::Layout;
use crate::shell;

/// The llama-cpp-python release whose vendored llama.cpp we build.
pub const SDIST_NAME: &str = "llama-cpp-python";
pub const SDIST_VERSION: &str = "0.3.36";

/// The build's switches besides the instruction sets, which come from the CPU at hand
/// ([`CpuFeatures::cmake_flags`]).
const BASE_CMAKE_FLAGS: &[&str] = &[
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DGGML_OPENMP=ON",
];

/// Every cmake switch of the reference build on this CPU.
pub fn cmake_flags(cpu: &CpuFeatures) -> Vec<String> {
    BASE_CMAKE_FLAGS
        .iter()
        .map(|f| f.to_string())
        .chain(cpu.cmake_flags())
        .collect()
}

/// The stamp lists these, so adding one re-runs the build, which (incremental) compiles
/// only the new target.
const TARGETS: &[&str] = &[
    "llama-tokenize",
    "llama-quantize",
    "llama-bench",
    "llama-completion",
    "llama-perplexity",
    "llama-server",
    "llama",
];
const BINARIES: &[&str] = &[
    "llama-tokenize",
    "llama-quantize",
    "llama-bench",
    "llama-completion",
    "llama-perplexity",
    "llama-server",
];
/// Static libraries the dump tool links, in link order.
const LIBRARIES: &[&str] = &[
    "src/libllama.a",
    "ggml/src/libggml.a",
    "ggml/src/libggml-cpu.a",
    "ggml/src/libggml-base.a",
];

const DUMP_TOOL_SOURCE: &str = "xtask/reference/dump_logits.c";

pub struct LlamaCpp {
    sdists: PathBuf,
    /// `~/.cache/prima/llama.cpp`
    root: PathBuf,
    dump_tool_source: PathBuf,
    /// `~/.cache/prima`, where a cmake from PyPI goes when the machine has none.
    cache: PathBuf,
}

/// What fixtures record about the reference build.
pub struct Version {
    pub sdist: String,
    pub commit: String,
    pub ggml: String,
    /// The cmake switches of the build, its CPU's instruction sets included.
    pub cmake_flags: String,
}

impl LlamaCpp {
    pub fn new(layout: &Layout) -> Self {
        LlamaCpp {
            sdists: layout.sdists(),
            root: layout.llama_cpp(),
            dump_tool_source: layout.workspace.join(DUMP_TOOL_SOURCE),
            cache: layout.cache.clone(),
        }
    }

    /// `<sdist>/vendor/llama.cpp`
    pub fn source(&self) -> PathBuf {
        self.sdists
            .join(format!("{}-{SDIST_VERSION}", SDIST_NAME.replace('-', "_")))
            .join("vendor/llama.cpp")
    }

    fn build_dir(&self) -> PathBuf {
        self.root.join("build")
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.build_dir().join("bin").join(name)
    }

    pub fn dump_tool(&self) -> PathBuf {
        self.root.join("dump_logits")
    }

    /// Python path entry for the `gguf` package matching this llama.cpp.
    pub fn gguf_py(&self) -> PathBuf {
        self.source().join("gguf-py")
    }

    /// Fetch the source and build it for this CPU unless a build for the same CPU
    /// features, flags and targets exists.
    pub fn ensure_built(&self) -> Result<()> {
        self.ensure_source()?;
        let cpu = CpuFeatures::detect()?;
        let flags = cmake_flags(&cpu);
        let stamp_path = self.build_dir().join("prima-build.stamp");
        let stamp = build_stamp(&flags);
        let built = BINARIES.iter().all(|b| self.bin(b).exists())
            && LIBRARIES.iter().all(|l| self.build_dir().join(l).exists());
        if built && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
            return Ok(());
        }
        let cmake = build_tools::cmake(&self.cache)?;
        fs::create_dir_all(&self.root)?;
        let log = self.root.join("build.log");
        fs::write(&log, "")?;
        let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
        eprintln!(
            "building llama.cpp {SDIST_VERSION} for {} with {jobs} jobs (log: {})",
            cpu.summary(),
            log.display()
        );
        let started = std::time::Instant::now();
        // A stale stamp means other CPU features or flags: drop the old objects too.
        let _ = fs::remove_file(&stamp_path);
        shell::run_logged(
            Command::new(&cmake)
                .arg("-S")
                .arg(self.source())
                .arg("-B")
                .arg(self.build_dir())
                .args(&flags),
            &log,
        )?;
        shell::run_logged(
            Command::new(&cmake)
                .arg("--build")
                .arg(self.build_dir())
                .arg(format!("-j{jobs}"))
                .arg("--target")
                .args(TARGETS),
            &log,
        )?;
        fs::write(&stamp_path, stamp)?;
        eprintln!("built llama.cpp in {:.0?}", started.elapsed());
        Ok(())
    }

    /// `llama-bench` of a second build, in `build-avx2`, with every AVX-512 and VNNI switch
    /// off (the rest as [`cmake_flags`]): llama.cpp at the level of `PRIMA_CPU_KERNELS=avx2`,
    /// for `cargo xtask bench --kernels avx2` on an AVX-512 machine. Built when missing or
    /// when its stamp differs.
    pub fn ensure_avx2_bench(&self) -> Result<PathBuf> {
        self.ensure_source()?;
        let flags: Vec<String> = cmake_flags(&CpuFeatures::detect()?)
            .into_iter()
            .map(|f| match f.strip_suffix("=ON") {
                Some(name) if name.contains("AVX512") || name.contains("VNNI") => {
                    format!("{name}=OFF")
                }
                _ => f,
            })
            .collect();
        let dir = self.root.join("build-avx2");
        let bin = dir.join("bin/llama-bench");
        let stamp_path = dir.join("prima-build.stamp");
        let stamp = format!("{SDIST_NAME} {SDIST_VERSION}\nflags: {}\n", flags.join(" "));
        if bin.exists() && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
            return Ok(bin);
        }
        let cmake = build_tools::cmake(&self.cache)?;
        let log = self.root.join("build-avx2.log");
        fs::write(&log, "")?;
        eprintln!("building an AVX2-only llama-bench (log: {})", log.display());
        let _ = fs::remove_file(&stamp_path);
        shell::run_logged(
            Command::new(&cmake)
                .arg("-S")
                .arg(self.source())
                .arg("-B")
                .arg(&dir)
                .args(&flags),
            &log,
        )?;
        let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
        shell::run_logged(
            Command::new(&cmake)
                .arg("--build")
                .arg(&dir)
                .arg(format!("-j{jobs}"))
                .args(["--target", "llama-bench"]),
            &log,
        )?;
        fs::write(&stamp_path, stamp)?;
        Ok(bin)
    }

    /// The cmake switches the existing build was made with (from its stamp).
    pub fn built_flags(&self) -> Result<String> {
        let stamp_path = self.build_dir().join("prima-build.stamp");
        let stamp = fs::read_to_string(&stamp_path)
            .with_context(|| format!("reading {}", stamp_path.display()))?;
        stamp
            .lines()
            .find_map(|l| l.strip_prefix("flags: "))
            .map(str::to_owned)
            .with_context(|| format!("no flags in {}", stamp_path.display()))
    }

    /// Fail unless the build exists (for `--fixtures-only`).
    pub fn require_built(&self) -> Result<()> {
        for b in BINARIES {
            if !self.bin(b).exists() {
                bail!(
                    "{} is missing; run `cargo xtask reference` without --fixtures-only",
                    self.bin(b).display()
                );
            }
        }
        Ok(())
    }

    /// Compile `xtask/reference/dump_logits.c` against the static build
    /// when the binary is missing or older than its inputs.
    pub fn ensure_dump_tool(&self) -> Result<PathBuf> {
        let tool = self.dump_tool();
        let libs: Vec<PathBuf> = LIBRARIES.iter().map(|l| self.build_dir().join(l)).collect();
        let inputs: Vec<&Path> = std::iter::once(self.dump_tool_source.as_path())
            .chain(libs.iter().map(PathBuf::as_path))
            .collect();
        if is_newer_than_all(&tool, &inputs) {
            return Ok(tool);
        }
        let object = self.root.join("dump_logits.o");
        let src = self.source();
        shell::run(
            Command::new("cc")
                .args(["-O2", "-std=c11", "-Wall", "-Wextra"])
                .arg("-I")
                .arg(src.join("include"))
                .arg("-I")
                .arg(src.join("ggml/include"))
                .arg("-c")
                .arg(&self.dump_tool_source)
                .arg("-o")
                .arg(&object),
        )?;
        shell::run(
            Command::new("g++")
                .arg(&object)
                .args(&libs)
                .args(["-fopenmp", "-lpthread", "-lm", "-o"])
                .arg(&tool),
        )?;
        Ok(tool)
    }

    pub fn version(&self) -> Result<Version> {
        let build_info = self.build_dir().join("common/build-info.cpp");
        let ggml_version = self.build_dir().join("ggml/src/ggml-version.h");
        let commit = quoted_value(&fs::read_to_string(&build_info)?, "LLAMA_COMMIT")
            .with_context(|| format!("no LLAMA_COMMIT in {}", build_info.display()))?;
        let ggml = quoted_value(&fs::read_to_string(&ggml_version)?, "GGML_VERSION")
            .with_context(|| format!("no GGML_VERSION in {}", ggml_version.display()))?;
        Ok(Version {
            sdist: format!("{SDIST_NAME} {SDIST_VERSION}"),
            commit,
            ggml,
            cmake_flags: self.built_flags()?,
        })
    }

    /// Fetch and unpack the sdist unless its source is there (the Vulkan build,
    /// [`crate::llama_vulkan`], shares it).
    pub fn ensure_source(&self) -> Result<()> {
        if self.source().join("include/llama.h").exists() {
            return Ok(());
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch_sdist.py");
        eprintln!("fetching the {SDIST_NAME} {SDIST_VERSION} sdist");
        shell::run(
            Command::new("python3")
                .arg(script)
                .args(["--name", SDIST_NAME, "--version", SDIST_VERSION, "--dest"])
                .arg(&self.sdists),
        )?;
        if !self.source().join("include/llama.h").exists() {
            bail!(
                "the sdist unpacked without {}",
                self.source().join("include/llama.h").display()
            );
        }
        Ok(())
    }
}

fn build_stamp(flags: &[String]) -> String {
    format!(
        "{SDIST_NAME} {SDIST_VERSION}\nflags: {}\ntargets: {}\n",
        flags.join(" "),
        TARGETS.join(" ")
    )
}

fn modified(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn is_newer_than_all(target: &Path, inputs: &[&Path]) -> bool {
    let Some(t) = modified(target) else {
        return false;
    };
    inputs.iter().all(|i| modified(i).is_some_and(|m| m <= t))
}

/// The string after `key` in a line such as `#define KEY "v"` or `… KEY = "v";`.
fn quoted_value(text: &str, key: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains(key) && l.contains('"'))?;
    let start = line.find('"')? + 1;
    let end = start + line[start..].find('"')?;
    Some(line[start..end].to_string())
}
