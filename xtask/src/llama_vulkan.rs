//! llama.cpp's Vulkan build, the reference beside Prima's wgpu backend in
//! `cargo xtask bench --backend wgpu`: `llama-bench` built with `GGML_VULKAN=ON` into
//! `~/.cache/prima/tools/llama-vulkan/build`, from the sdist the CPU build uses
//! ([`LlamaCpp::source`]), with the same CPU switches ([`llama_cpp::cmake_flags`]).
//!
//! Both sides run on lavapipe alone: [`lavapipe_env`] points the Vulkan loader at
//! lavapipe's driver only (so a real GPU on the machine is not picked by either), and
//! ggml, which skips CPU devices such as lavapipe unless `GGML_VK_VISIBLE_DEVICES` names
//! them, is given lavapipe's index ([`lavapipe_device`]).
//!
//! Building needs Vulkan's headers and a GLSL compiler for ggml's shaders; as root on
//! Debian or Ubuntu they are installed with apt-get when missing. This llama.cpp needs
//! newer Vulkan headers than Debian 12's (see [`MIN_HEADERS`]): there, Debian
//! [`NEWER_DEBIAN`]'s `libvulkan-dev` is downloaded with apt-get (from the mirror the
//! system's sources name, into a private package list) and unpacked into the cache,
//! installing nothing, and the compiler finds it first (`CPLUS_INCLUDE_PATH`). Nothing here
//! is committed; the build is skipped when its binary exists and its stamp (sdist version,
//! flags, headers, targets) matches.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::build_tools;
use crate::cpu_features::CpuFeatures;
use crate::layout::Layout;
use crate::llama_cpp::{self, LlamaCpp, SDIST_NAME, SDIST_VERSION};
use crate::shell;

/// Debian's packages for the build (loader and headers, `glslc`, the SPIR-V headers
/// ggml's shader generator includes) and for the run (lavapipe).
const PACKAGES: [&str; 4] = [
    "libvulkan-dev",
    "glslc",
    "spirv-headers",
    "mesa-vulkan-drivers",
];

const TARGETS: &[&str] = &["llama-bench"];

/// The oldest Vulkan headers this llama.cpp compiles with: it uses `VK_EXT_layer_settings`
/// (headers 1.3.272) without a guard. Debian 12 has 1.3.239.
const MIN_HEADERS: (u32, u32, u32) = (1, 3, 272);
/// The Debian release whose `libvulkan-dev` (1.4.309) is new enough.
const NEWER_DEBIAN: &str = "trixie";

/// How many Vulkan device indices [`lavapipe_device`] tries.
const MAX_DEVICES: usize = 16;

/// The Vulkan `llama-bench`, built (or rebuilt when its stamp differs) if needed.
pub fn ensure_bench(layout: &Layout, llama: &LlamaCpp) -> Result<PathBuf> {
    let root = layout.cache.join("tools").join("llama-vulkan");
    let dir = root.join("build");
    let bin = dir.join("bin").join("llama-bench");
    let flags = cmake_flags(&CpuFeatures::detect()?);
    ensure_build_packages()?;
    let headers = vulkan_headers(&root)?;
    let stamp_path = dir.join("prima-build.stamp");
    let stamp = build_stamp(&flags, headers.as_deref());
    if bin.exists() && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        return Ok(bin);
    }
    llama.ensure_source()?;
    let source = llama.source();
    // A build tree configured from another copy of the source cannot be reconfigured.
    if configured_source(&dir).is_some_and(|s| s != source) {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(&root)?;
    let cmake = build_tools::cmake(&layout.cache)?;
    let log = root.join("build.log");
    fs::write(&log, "")?;
    eprintln!(
        "building llama.cpp {SDIST_VERSION}'s Vulkan llama-bench (many shaders: long; log: {})",
        log.display()
    );
    let started = std::time::Instant::now();
    let _ = fs::remove_file(&stamp_path);
    // The compiler searches these before the system's include directory.
    let cmake_with_headers = || {
        let mut cmd = Command::new(&cmake);
        if let Some(include) = &headers {
            cmd.env("CPLUS_INCLUDE_PATH", include)
                .env("C_INCLUDE_PATH", include);
        }
        cmd
    };
    shell::run_logged(
        cmake_with_headers()
            .arg("-S")
            .arg(&source)
            .arg("-B")
            .arg(&dir)
            .args(&flags),
        &log,
    )?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    shell::run_logged(
        cmake_with_headers()
            .arg("--build")
            .arg(&dir)
            .arg(format!("-j{jobs}"))
            .arg("--target")
            .args(TARGETS),
        &log,
    )?;
    fs::write(&stamp_path, stamp)?;
    eprintln!("built the Vulkan llama-bench in {:.0?}", started.elapsed());
    Ok(bin)
}

/// The CPU build's switches plus the Vulkan backend.
pub fn cmake_flags(cpu: &CpuFeatures) -> Vec<String> {
    let mut flags = llama_cpp::cmake_flags(cpu);
    flags.push("-DGGML_VULKAN=ON".to_owned());
    flags
}

fn build_stamp(flags: &[String], headers: Option<&Path>) -> String {
    let headers = headers.map_or("the system's".to_owned(), |h| h.display().to_string());
    format!(
        "{SDIST_NAME} {SDIST_VERSION}\nflags: {}\nvulkan headers: {headers}\ntargets: {}\n",
        flags.join(" "),
        TARGETS.join(" ")
    )
}

/// The Vulkan headers' version in an include directory (`vulkan/vulkan_core.h`).
fn header_version(include: &Path) -> Option<(u32, u32, u32)> {
    let text = fs::read_to_string(include.join("vulkan/vulkan_core.h")).ok()?;
    let define = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("#define ")?.strip_prefix(name))
            .map(str::trim)
            .map(str::to_owned)
    };
    let patch = define("VK_HEADER_VERSION ")?.parse().ok()?;
    // `VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)`
    let complete = define("VK_HEADER_VERSION_COMPLETE ")?;
    let args = complete.split_once('(')?.1.trim_end_matches(')');
    let parts: Vec<&str> = args.split(',').map(str::trim).collect();
    let [_, major, minor, _] = parts[..] else {
        return None;
    };
    Some((major.parse().ok()?, minor.parse().ok()?, patch))
}

/// An include directory to put before the system's, or `None` when the system's Vulkan
/// headers are new enough: `headers-X.Y.Z/usr/include` under `root`, from Debian
/// [`NEWER_DEBIAN`]'s `libvulkan-dev` (downloaded and unpacked when missing).
fn vulkan_headers(root: &Path) -> Result<Option<PathBuf>> {
    let system = header_version(Path::new("/usr/include"));
    if system.is_some_and(|v| v >= MIN_HEADERS) {
        return Ok(None);
    }
    let unpacked = |dir: &Path| {
        let include = dir.join("usr/include");
        header_version(&include)
            .is_some_and(|v| v >= MIN_HEADERS)
            .then_some(include)
    };
    if let Some(found) = fs::read_dir(root).ok().and_then(|entries| {
        let mut dirs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("headers-"))
            })
            .collect();
        dirs.sort();
        dirs.iter().rev().find_map(|d| unpacked(d))
    }) {
        return Ok(Some(found));
    }
    let too_old = |v: Option<(u32, u32, u32)>| match v {
        Some((a, b, c)) => format!("{a}.{b}.{c}"),
        None => "none".to_owned(),
    };
    let deb = download_newer_headers(root).with_context(|| {
        format!(
            "the system's Vulkan headers ({}) are older than this llama.cpp needs ({}.{}.{}); \
             install a newer libvulkan-dev (Debian 13, Ubuntu 24.04)",
            too_old(system),
            MIN_HEADERS.0,
            MIN_HEADERS.1,
            MIN_HEADERS.2
        )
    })?;
    let staging = root.join("headers-unpacking");
    let _ = fs::remove_dir_all(&staging);
    shell::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&staging))?;
    let Some((a, b, c)) = header_version(&staging.join("usr/include")) else {
        bail!("{} holds no vulkan/vulkan_core.h", deb.display());
    };
    let dir = root.join(format!("headers-{a}.{b}.{c}"));
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&staging, &dir)?;
    unpacked(&dir)
        .map(Some)
        .with_context(|| format!("{}: headers {a}.{b}.{c} are still too old", deb.display()))
}

/// `libvulkan-dev` of Debian [`NEWER_DEBIAN`], downloaded with apt-get into `root/apt`
/// through a package list of its own (the system's sources and lists stay as they are).
fn download_newer_headers(root: &Path) -> Result<PathBuf> {
    if !Path::new("/etc/debian_version").exists() {
        bail!("not a Debian system");
    }
    let mirror = debian_mirror().context("no Debian mirror in /etc/apt's sources")?;
    let apt = root.join("apt");
    let parts = apt.join("sources.list.d");
    for dir in [
        &parts,
        &apt.join("lists/partial"),
        &apt.join("archives/partial"),
    ] {
        fs::create_dir_all(dir)?;
    }
    let list = apt.join("sources.list");
    fs::write(
        &list,
        format!("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {NEWER_DEBIAN} main\n"),
    )?;
    let apt_get = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.arg("-qq")
            .arg(format!("-oDir::Etc::sourcelist={}", list.display()))
            .arg(format!("-oDir::Etc::sourceparts={}", parts.display()))
            .arg(format!(
                "-oDir::State::Lists={}",
                apt.join("lists").display()
            ))
            .arg(format!(
                "-oDir::Cache::Archives={}",
                apt.join("archives").display()
            ))
            .args(args)
            .current_dir(&apt);
        cmd
    };
    eprintln!(
        "downloading Debian {NEWER_DEBIAN}'s libvulkan-dev for its headers (nothing is installed)"
    );
    shell::run(&mut apt_get(&["update"]))?;
    shell::run(&mut apt_get(&["download", "libvulkan-dev"]))?;
    fs::read_dir(&apt)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libvulkan-dev_"))
        })
        .with_context(|| {
            format!(
                "apt-get download left no libvulkan-dev_*.deb in {}",
                apt.display()
            )
        })
}

/// The Debian archive the system's apt sources use (`URIs:` of a deb822 file or a
/// one-line `deb URI suite …` entry), security archives aside.
fn debian_mirror() -> Option<String> {
    let mut files: Vec<PathBuf> = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(entries.flatten().map(|e| e.path()));
    }
    files.iter().find_map(|file| {
        let text = fs::read_to_string(file).ok()?;
        text.lines().find_map(|line| {
            let line = line.trim();
            let uri = match line.strip_prefix("URIs:") {
                Some(uris) => uris.split_whitespace().next()?,
                None => line
                    .strip_prefix("deb ")?
                    .split_whitespace()
                    .find(|w| w.contains("://"))?,
            };
            (uri.contains("debian") && !uri.contains("security")).then(|| uri.to_owned())
        })
    })
}

/// The source directory a cmake build tree was configured from.
fn configured_source(dir: &Path) -> Option<PathBuf> {
    let cache = fs::read_to_string(dir.join("CMakeCache.txt")).ok()?;
    cache
        .lines()
        .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .map(PathBuf::from)
}

/// `glslc` and the Vulkan headers, installed with apt-get where missing and possible.
fn ensure_build_packages() -> Result<()> {
    let present = || {
        shell::on_path("glslc")
            && Path::new("/usr/include/vulkan/vulkan.h").exists()
            && Path::new("/usr/include/spirv").exists()
    };
    if present() {
        return Ok(());
    }
    // SAFETY: geteuid only reads the process's effective user id.
    let root = unsafe { libc::geteuid() } == 0;
    if root && Path::new("/etc/debian_version").exists() {
        eprintln!(
            "installing Vulkan build tools (apt-get install {})",
            PACKAGES.join(" ")
        );
        shell::apt_install(&PACKAGES);
    }
    if !present() {
        bail!(
            "llama.cpp's Vulkan build needs glslc and the Vulkan and SPIR-V headers: install `{}` (Debian/Ubuntu)",
            PACKAGES.join(" ")
        );
    }
    Ok(())
}

/// Where Debian, Ubuntu and a local Mesa install put Vulkan drivers' manifests.
const ICD_DIRS: [&str; 3] = [
    "/usr/share/vulkan/icd.d",
    "/etc/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
];

/// Lavapipe's driver manifest for this machine's architecture (`lvp_icd.x86_64.json`).
fn lavapipe_icd() -> Result<PathBuf> {
    let name = format!("lvp_icd.{}.json", std::env::consts::ARCH);
    ICD_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(&name))
        .find(|path| path.exists())
        .with_context(|| {
            format!(
                "lavapipe's {name} is in none of {}; install `mesa-vulkan-drivers`",
                ICD_DIRS.join(", ")
            )
        })
}

/// The environment that leaves the Vulkan loader lavapipe's driver only (both variable
/// names: `VK_DRIVER_FILES` for loaders since 1.3.207, `VK_ICD_FILENAMES` before).
pub fn lavapipe_env() -> Result<Vec<(&'static str, String)>> {
    let icd = lavapipe_icd()?.to_string_lossy().into_owned();
    Ok(vec![
        ("VK_DRIVER_FILES", icd.clone()),
        ("VK_ICD_FILENAMES", icd),
    ])
}

/// Lavapipe among ggml's Vulkan devices: its index (for `GGML_VK_VISIBLE_DEVICES`) and
/// the name ggml gives it (`llvmpipe (LLVM …)`).
/// `env` is [`lavapipe_env`]'s, so the index is 0 unless the loader ignores it.
pub fn lavapipe_device(llama_bench: &Path, env: &[(&str, String)]) -> Result<(usize, String)> {
    let mut seen = Vec::new();
    for index in 0..MAX_DEVICES {
        let out = Command::new(llama_bench)
            .arg("--list-devices")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("GGML_VK_VISIBLE_DEVICES", index.to_string())
            .output()
            .with_context(|| format!("cannot run {}", llama_bench.display()))?;
        // An index past the last device makes ggml fail: there are no more.
        if !out.status.success() {
            break;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let Some(name) = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Vulkan0: "))
            .map(str::to_owned)
        else {
            break;
        };
        if name.starts_with("llvmpipe") {
            return Ok((index, name));
        }
        seen.push(name);
    }
    bail!(
        "no lavapipe (llvmpipe) among llama.cpp's Vulkan devices ({}); install `mesa-vulkan-drivers`",
        if seen.is_empty() {
            "none found".to_owned()
        } else {
            seen.join("; ")
        }
    )
}
