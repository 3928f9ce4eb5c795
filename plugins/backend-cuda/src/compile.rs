//! Kernel sources → PTX with NVRTC, for the device's compute capability, cached on disk.
//!
//! The cache file is keyed by everything that changes the PTX: the source's SHA-256, the
//! architecture and NVRTC's version, so a new plugin, a new GPU or a new NVRTC compiles
//! afresh and old entries are simply never read again. The cache is an optimisation only:
//! an unreadable or unwritable cache directory means compiling every time, not an error.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::kernels::{self, Family};

/// Environment variable overriding the cache directory.
pub const CACHE_DIR_ENV: &str = "PRIMA_CUDA_CACHE";

/// What a compiled module depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    pub family: &'static str,
    /// SHA-256 of the complete source, hex.
    pub source_sha256: String,
    /// Compute capability, e.g. (9, 0).
    pub arch: (i32, i32),
    /// NVRTC's (major, minor).
    pub nvrtc: (i32, i32),
}

impl CacheKey {
    pub fn new(family: Family, source: &str, arch: (i32, i32), nvrtc: (i32, i32)) -> CacheKey {
        CacheKey {
            family: family.name(),
            source_sha256: hex::encode(Sha256::digest(source.as_bytes())),
            arch,
            nvrtc,
        }
    }

    /// The cache file's name: `<family>-<sha256 prefix>-sm<arch>-nvrtc<major>.<minor>.ptx`.
    pub fn file_name(&self) -> String {
        format!(
            "{}-{}-sm{}{}-nvrtc{}.{}.ptx",
            self.family,
            &self.source_sha256[..16],
            self.arch.0,
            self.arch.1,
            self.nvrtc.0,
            self.nvrtc.1
        )
    }
}

/// `$PRIMA_CUDA_CACHE`, else `$XDG_CACHE_HOME/prima/cuda`, else `~/.cache/prima/cuda`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV).filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("prima").join("cuda"))
}

/// NVRTC's version; NVRTC must be loadable (checked by [`crate::probe`]).
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {r:?}"));
    }
    Ok((major, minor))
}

/// The PTX of `family` for `arch`: from the cache when present, else compiled (and stored).
pub fn ptx(family: Family, arch: (i32, i32), nvrtc: (i32, i32)) -> Result<String, String> {
    let source = kernels::source(family);
    let key = CacheKey::new(family, &source, arch, nvrtc);
    let path = cache_dir().map(|d| d.join(key.file_name()));
    if let Some(ptx) = path.as_deref().and_then(read_cached) {
        return Ok(ptx);
    }
    let ptx = compile(family, &source, arch)?;
    if let Some(path) = &path {
        if let Err(e) = store(path, &ptx) {
            // Not fatal: the next run compiles again.
            eprintln!("prima cuda: cannot cache {}: {e}", path.display());
        }
    }
    Ok(ptx)
}

fn read_cached(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    // A truncated file (a crash mid-write would not leave one, but a full disk might).
    text.contains(".entry").then_some(text)
}

/// Writes beside the target and renames, so a concurrent reader never sees half a file.
fn store(path: &Path, ptx: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.{}.tmp", std::process::id(), key_stem(path)));
    std::fs::write(&tmp, ptx)?;
    std::fs::rename(&tmp, path)
}

fn key_stem(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// NVRTC options for a device of compute capability `arch`.
pub fn options(arch: (i32, i32)) -> Vec<String> {
    vec![
        format!("--gpu-architecture=compute_{}{}", arch.0, arch.1),
        "--std=c++17".to_string(),
    ]
}

fn compile(family: Family, source: &str, arch: (i32, i32)) -> Result<String, String> {
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
    let opts = CompileOptions {
        options: options(arch),
        name: Some(format!("{}.cu", family.name())),
        ..Default::default()
    };
    match compile_ptx_with_opts(source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { nvrtc, log, .. }) => Err(format!(
            "NVRTC could not compile {}.cu for sm_{}{} ({nvrtc:?}):\n{}",
            family.name(),
            arch.0,
            arch.1,
            log.to_string_lossy()
        )),
        Err(e) => Err(format!("NVRTC failed on {}.cu: {e:?}", family.name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_changes_with_source_arch_and_nvrtc() {
        let src = kernels::source(Family::Rope);
        let k = CacheKey::new(Family::Rope, &src, (9, 0), (13, 0));
        assert_eq!(k.source_sha256.len(), 64);
        let name = k.file_name();
        assert!(
            name.starts_with("rope-") && name.ends_with("-sm90-nvrtc13.0.ptx"),
            "{name}"
        );
        let other_src = CacheKey::new(Family::Rope, &(src.clone() + " "), (9, 0), (13, 0));
        let other_arch = CacheKey::new(Family::Rope, &src, (7, 5), (13, 0));
        let other_nvrtc = CacheKey::new(Family::Rope, &src, (9, 0), (12, 8));
        for o in [other_src, other_arch, other_nvrtc] {
            assert_ne!(o.file_name(), name);
        }
        // Same inputs, same key: the cache is hit across runs.
        assert_eq!(CacheKey::new(Family::Rope, &src, (9, 0), (13, 0)), k);
    }

    #[test]
    fn families_have_distinct_cache_files() {
        let names: std::collections::HashSet<String> = Family::ALL
            .iter()
            .map(|&f| CacheKey::new(f, &kernels::source(f), (8, 6), (12, 4)).file_name())
            .collect();
        assert_eq!(names.len(), Family::ALL.len());
    }

    #[test]
    fn store_and_read_back() {
        let dir = std::env::temp_dir().join(format!("prima-cuda-cache-{}", std::process::id()));
        let path = dir.join("x-sm90-nvrtc13.0.ptx");
        store(&path, ".version 8.0\n.entry foo() {}\n").unwrap();
        assert!(read_cached(&path).unwrap().contains(".entry foo"));
        std::fs::write(&path, "trunc").unwrap();
        assert!(
            read_cached(&path).is_none(),
            "a file without an entry is not used"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every kernel source compiles, for the oldest and newest architectures the kernels
    /// target, wherever NVRTC can be loaded (it needs no GPU or driver); skipped elsewhere.
    #[test]
    fn every_family_compiles_where_nvrtc_is_present() {
        // SAFETY: only tries to dlopen NVRTC by its usual names.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("no NVRTC here: skipped");
            return;
        }
        for arch in [(7, 5), (9, 0)] {
            for f in Family::ALL {
                let ptx = compile(f, &kernels::source(f), arch).unwrap_or_else(|e| panic!("{e}"));
                assert!(ptx.contains(".entry"), "{f:?}");
            }
        }
    }

    #[test]
    fn options_name_the_architecture() {
        assert!(options((9, 0)).contains(&"--gpu-architecture=compute_90".to_string()));
    }
}
