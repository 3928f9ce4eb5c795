//! Release archives as cargo-dist makes them — `.tar.xz` for Unix targets, `.zip` for
//! Windows, every file under one top directory named like the archive — read into
//! memory, and written back the same way, with SHA-256 sums.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// One file of an archive, its path relative to the archive's top directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// `/`-separated, relative, never `..`.
    pub path: String,
    pub data: Vec<u8>,
    pub executable: bool,
}

/// The archive kind a file name says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    TarXz,
    Zip,
}

impl Format {
    pub fn of(path: &Path) -> Result<Format> {
        let name = path.to_string_lossy();
        if name.ends_with(".tar.xz") {
            Ok(Format::TarXz)
        } else if name.ends_with(".zip") {
            Ok(Format::Zip)
        } else {
            bail!(
                "{}: not a .tar.xz or .zip archive (set cargo-dist's unix-archive / \
                 windows-archive back to those)",
                path.display()
            )
        }
    }

    /// What cargo-dist makes for `target` by default.
    pub fn for_target(target: &str) -> Format {
        if target.contains("-windows") {
            Format::Zip
        } else {
            Format::TarXz
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::TarXz => "tar.xz",
            Format::Zip => "zip",
        }
    }
}

/// Every file in the archive at `path`, with its top directory taken off.
pub fn read(path: &Path) -> Result<Vec<Entry>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let entries = match Format::of(path)? {
        Format::TarXz => read_tar_xz(BufReader::new(file)),
        Format::Zip => read_zip(file),
    };
    entries.with_context(|| format!("reading {}", path.display()))
}

fn read_tar_xz(input: impl Read) -> Result<Vec<Entry>> {
    let mut archive = tar::Archive::new(liblzma::read::XzDecoder::new(input));
    let mut entries = Vec::new();
    for item in archive.entries()? {
        let mut item = item?;
        if !item.header().entry_type().is_file() {
            continue;
        }
        let path = item.path()?.to_string_lossy().into_owned();
        let executable = item.header().mode()? & 0o111 != 0;
        let mut data = Vec::new();
        item.read_to_end(&mut data)?;
        entries.push(Entry {
            path: below_top_dir(&path)?,
            data,
            executable,
        });
    }
    Ok(entries)
}

fn read_zip(input: File) -> Result<Vec<Entry>> {
    let mut archive = zip::ZipArchive::new(input)?;
    let mut entries = Vec::new();
    for i in 0..archive.len() {
        let mut item = archive.by_index(i)?;
        if !item.is_file() {
            continue;
        }
        let path = item.name().to_string();
        let executable = item.unix_mode().is_some_and(|m| m & 0o111 != 0) || path.ends_with(".exe");
        let mut data = Vec::new();
        item.read_to_end(&mut data)?;
        entries.push(Entry {
            path: below_top_dir(&path)?,
            data,
            executable,
        });
    }
    Ok(entries)
}

/// `top/a/b` → `a/b`; refuses paths that would leave the directory they unpack into.
fn below_top_dir(path: &str) -> Result<String> {
    let parts: Vec<&str> = path
        .split(['/', '\\'])
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.len() < 2 {
        bail!("{path}: outside the archive's top directory");
    }
    if parts.iter().any(|p| *p == ".." || p.contains(':')) {
        bail!("{path}: a path that leaves the archive");
    }
    Ok(parts[1..].join("/"))
}

/// Writes `entries` under the top directory `top` into a new archive at `path`.
pub fn write(path: &Path, top: &str, entries: &[Entry]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let written = match Format::of(path)? {
        Format::TarXz => write_tar_xz(BufWriter::new(file), top, entries),
        Format::Zip => write_zip(file, top, entries),
    };
    written.with_context(|| format!("writing {}", path.display()))
}

fn write_tar_xz(output: impl Write, top: &str, entries: &[Entry]) -> Result<()> {
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut tar = tar::Builder::new(liblzma::write::XzEncoder::new(output, 6));
    let mut dirs = std::collections::BTreeSet::new();
    for entry in entries {
        // Directories first, so that unpacking makes them with ordinary permissions.
        let mut dir = top.to_string();
        for part in entry
            .path
            .split('/')
            .rev()
            .skip(1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            dir = format!("{dir}/{part}");
            dirs.insert(dir.clone());
        }
    }
    for dir in std::iter::once(top.to_string()).chain(dirs) {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_mtime(mtime);
        header.set_size(0);
        tar.append_data(&mut header, format!("{dir}/"), std::io::empty())?;
    }
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(if entry.executable { 0o755 } else { 0o644 });
        header.set_mtime(mtime);
        header.set_size(entry.data.len() as u64);
        tar.append_data(
            &mut header,
            format!("{top}/{}", entry.path),
            entry.data.as_slice(),
        )?;
    }
    tar.into_inner()?.finish()?.flush()?;
    Ok(())
}

fn write_zip(output: File, top: &str, entries: &[Entry]) -> Result<()> {
    let mut zip = zip::ZipWriter::new(output);
    for entry in entries {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(if entry.executable { 0o755 } else { 0o644 });
        zip.start_file(format!("{top}/{}", entry.path), options)?;
        zip.write_all(&entry.data)?;
    }
    zip.finish()?;
    Ok(())
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// A `sha256sum -c` file: one `<hex>  <path>` line per entry, sorted by path.
pub fn sums_file(entries: &[Entry]) -> String {
    let mut lines: Vec<String> = entries
        .iter()
        .map(|e| format!("{}  {}\n", sha256_hex(&e.data), e.path))
        .collect();
    lines.sort_by(|a, b| a[66..].cmp(&b[66..]));
    lines.concat()
}

/// The entries a sums file names whose content differs or which are missing, and the
/// entries it does not name (besides itself).
pub fn check_sums(sums_name: &str, entries: &[Entry]) -> Result<()> {
    let sums = entries
        .iter()
        .find(|e| e.path == sums_name)
        .with_context(|| format!("no {sums_name} in the archive"))?;
    let text =
        std::str::from_utf8(&sums.data).with_context(|| format!("{sums_name} is not UTF-8"))?;
    let mut named = std::collections::BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let (hex, path) = line
            .split_once("  ")
            .with_context(|| format!("{sums_name} line {}: not `<sha256>  <path>`", i + 1))?;
        let entry = entries
            .iter()
            .find(|e| e.path == path)
            .with_context(|| format!("{sums_name} names {path}, which the archive lacks"))?;
        if sha256_hex(&entry.data) != hex {
            bail!("{path}: its SHA-256 differs from {sums_name}'s");
        }
        named.insert(path);
    }
    if let Some(missed) = entries
        .iter()
        .find(|e| e.path != sums_name && !named.contains(e.path.as_str()))
    {
        bail!("{sums_name} does not name {}", missed.path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<Entry> {
        vec![
            Entry {
                path: "prima".into(),
                data: b"\x7fELF binary".to_vec(),
                executable: true,
            },
            Entry {
                path: "manifests/home.toml".into(),
                data: b"[model]\n".to_vec(),
                executable: false,
            },
        ]
    }

    #[test]
    fn what_is_written_reads_back_in_both_formats() {
        let dir = std::env::temp_dir().join(format!("prima-archive-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["a.tar.xz", "a.zip"] {
            let path = dir.join(name);
            write(&path, "prima-0.1.0-x", &entries()).unwrap();
            assert_eq!(read(&path).unwrap(), entries(), "{name}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sums_are_checked_and_a_changed_file_is_named() {
        let mut all = entries();
        all.push(Entry {
            path: "SHA256SUMS".into(),
            data: sums_file(&entries()).into_bytes(),
            executable: false,
        });
        check_sums("SHA256SUMS", &all).unwrap();
        all[1].data = b"changed".to_vec();
        let err = check_sums("SHA256SUMS", &all).unwrap_err().to_string();
        assert!(err.contains("manifests/home.toml"), "{err}");
    }

    #[test]
    fn paths_that_leave_the_archive_are_refused() {
        assert_eq!(below_top_dir("top/a/b").unwrap(), "a/b");
        assert!(below_top_dir("top/../../etc/passwd").is_err());
        assert!(below_top_dir("loose-file").is_err());
    }
}
