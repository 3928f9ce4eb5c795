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

use crate::layout::Layout;
use crate::shell;

/// The llama-cpp-python release whose vendored llama.cpp we build.
pub const SDIST_NAME: &str = "llama-cpp-python";
pub const SDIST_VERSION: &str = "0.3.36";

/// Portable x86-64 build with AVX-512 but no AMX (AMX faults on the CI CPUs).
pub const CMAKE_FLAGS: &[&str] = &[
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_AVX512=ON",
    "-DGGML_AVX512_VNNI=ON",
    "-DGGML_AVX512_VBMI=ON",
    "-DGGML_AVX512_BF16=ON",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DGGML_OPENMP=ON",
];

const TARGETS: &[&str] = &[
    "llama-tokenize",
    "llama-quantize",
    "llama-bench",
    "llama-completion",
    "llama",
];
const BINARIES: &[&str] = &[
    "llama-tokenize",
    "llama-quantize",
    "llama-bench",
    "llama-completion",
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
}

/// What fixtures record about the reference build.
pub struct Version {
    pub sdist: String,
    pub commit: String,
    pub ggml: String,
}

impl LlamaCpp {
    pub fn new(layout: &Layout) -> Self {
        LlamaCpp {
            sdists: layout.sdists(),
            root: layout.llama_cpp(),
            dump_tool_source: layout.workspace.join(DUMP_TOOL_SOURCE),
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

    /// Fetch the source and build it unless a matching build exists.
    pub fn ensure_built(&self) -> Result<()> {
        self.ensure_source()?;
        let stamp_path = self.build_dir().join("prima-build.stamp");
        let stamp = build_stamp();
        let built = BINARIES.iter().all(|b| self.bin(b).exists())
            && LIBRARIES.iter().all(|l| self.build_dir().join(l).exists());
        if built && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
            return Ok(());
        }
        let cmake = ensure_cmake()?;
        fs::create_dir_all(&self.root)?;
        let log = self.root.join("build.log");
        fs::write(&log, "")?;
        let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
        eprintln!(
            "building llama.cpp {SDIST_VERSION} with {jobs} jobs (log: {})",
            log.display()
        );
        let started = std::time::Instant::now();
        shell::run_logged(
            Command::new(&cmake)
                .arg("-S")
                .arg(self.source())
                .arg("-B")
                .arg(self.build_dir())
                .args(CMAKE_FLAGS),
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
        })
    }

    fn ensure_source(&self) -> Result<()> {
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

fn build_stamp() -> String {
    format!(
        "{SDIST_NAME} {SDIST_VERSION}\nflags: {}\ntargets: {}\n",
        CMAKE_FLAGS.join(" "),
        TARGETS.join(" ")
    )
}

/// The cmake to run: the system's, else the one from PyPI (installed when
/// missing; its bin directory is not always on PATH).
fn ensure_cmake() -> Result<PathBuf> {
    if shell::on_path("cmake") {
        return Ok(PathBuf::from("cmake"));
    }
    let locate = || -> Option<PathBuf> {
        let out = Command::new("python3")
            .args([
                "-c",
                "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))",
            ])
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    };
    if let Some(path) = locate() {
        return Ok(path);
    }
    eprintln!("installing cmake with pip");
    shell::run(Command::new("python3").args(["-m", "pip", "install", "cmake"]))?;
    locate().context("pip installed cmake but python cannot locate it")
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
