//! Expert use counts kept between runs: a device saves the counts of the MoE layers it
//! computed when its session ends and loads them when the next one starts, so its first
//! hot set is the learned one instead of uniform.
//!
//! One file per model, `~/.cache/prima/expert-use/<name>-<digest>.json` (or under
//! `$PRIMA_EXPERT_USE_DIR`; `off` there keeps nothing), the digest being the ring's model
//! fingerprint (file size and header hash), so a renamed copy shares it and a changed file
//! does not. The shape is the routing profile `prima plan --expert-use FILE` reads:
//! `{"model": NAME, "expert_use": [[count per expert] per layer]}`. Each device writes
//! only its own layers' rows and keeps the others' from the file (read, merged, written
//! to a temporary file and renamed over it), so the devices of a ring that share a
//! cache directory fill one file between them. A file that cannot be read or does not
//! match the model is a warning naming it, never an error: the plan starts uniform.

use std::io::Write;
use std::path::{Path, PathBuf};

use prima_core::model::Model;

use super::protocol::ModelFingerprint;

/// The directory of the use files, instead of `~/.cache/prima/expert-use`; `off`: none.
pub const EXPERT_USE_DIR_ENV: &str = "PRIMA_EXPERT_USE_DIR";

/// Counts are halved, layer by layer, once a layer's total passes this, so that what
/// runs route now outweighs what old runs routed.
pub const MAX_LAYER_TOTAL: u64 = 1 << 24;

#[derive(serde::Serialize, serde::Deserialize)]
struct UseFile {
    #[serde(default)]
    model: String,
    expert_use: Vec<Vec<u64>>,
}

/// The use file of `model`, or `None` when `$PRIMA_EXPERT_USE_DIR` is `off`.
pub fn use_file(model: &Model) -> Option<PathBuf> {
    let dir = match std::env::var_os(EXPERT_USE_DIR_ENV) {
        Some(d) if d == "off" => return None,
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(crate::profile::home_dir()).join(".cache/prima/expert-use"),
    };
    let print = ModelFingerprint::of(model.gguf());
    let name = model_name(model);
    let digest = print
        .header_sha256
        .get(..16)
        .unwrap_or(&print.header_sha256);
    Some(dir.join(format!("{name}-{}-{digest}.json", print.file_bytes)))
}

/// The model file's stem, in characters safe for a file name.
fn model_name(model: &Model) -> String {
    let stem = model
        .gguf()
        .path()
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let safe: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() {
        "model".into()
    } else {
        safe
    }
}

/// The counts in `path`, `[layer][expert]`, when it holds `n_layers` layers of
/// `n_expert` experts. A missing file is `None` quietly; any other failure is a warning
/// naming the file, and `None`.
pub fn load(path: &Path, n_layers: usize, n_expert: usize) -> Option<Vec<Vec<u64>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            warn(path, &e.to_string());
            return None;
        }
    };
    match parse(&text, n_layers, n_expert) {
        Ok(counts) => Some(counts),
        Err(why) => {
            warn(path, &why);
            None
        }
    }
}

fn warn(path: &Path, why: &str) {
    tracing::warn!(file = %path.display(), "expert use file ignored: {why}");
    eprintln!("warning: expert use file {} ignored: {why}", path.display());
}

/// Parses a use file and checks its shape.
fn parse(text: &str, n_layers: usize, n_expert: usize) -> Result<Vec<Vec<u64>>, String> {
    let file: UseFile = serde_json::from_str(text)
        .map_err(|e| format!("not an expert use file ({{\"expert_use\": [[counts]]}}): {e}"))?;
    if file.expert_use.len() != n_layers {
        return Err(format!(
            "{} layers, the model has {n_layers}",
            file.expert_use.len()
        ));
    }
    if let Some(il) = file.expert_use.iter().position(|l| l.len() != n_expert) {
        return Err(format!(
            "layer {il} has {} experts, the model {n_expert}",
            file.expert_use[il].len()
        ));
    }
    Ok(file.expert_use)
}

/// Writes `counts`' rows of `layers` into `path`, keeping the other layers' rows from the
/// file (when it has the same shape), atomically: a temporary file renamed over it.
pub fn save(
    path: &Path,
    model: &Model,
    counts: &[Vec<u64>],
    layers: &[usize],
) -> Result<(), String> {
    let n_layers = counts.len();
    let n_expert = counts.first().map_or(0, Vec::len);
    let mut merged = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| parse(&t, n_layers, n_expert).ok())
        .unwrap_or_else(|| vec![vec![0; n_expert]; n_layers]);
    for &il in layers {
        if let (Some(row), Some(new)) = (merged.get_mut(il), counts.get(il)) {
            row.clone_from(new);
            while row.iter().sum::<u64>() > MAX_LAYER_TOTAL {
                row.iter_mut().for_each(|c| *c /= 2);
            }
        }
    }
    let file = UseFile {
        model: model_name(model),
        expert_use: merged,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        serde_json::to_writer(&mut f, &file)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    remove_stale_temporaries(path);
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Removes the temporary files of writers killed before their rename (an hour old).
fn remove_stale_temporaries(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 3600);
        if file.starts_with(&prefix) && file.ends_with(".tmp") && old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_another_shape_is_refused_with_the_reason() {
        let ok = r#"{"model": "m", "expert_use": [[1, 2], [3, 4]]}"#;
        assert_eq!(parse(ok, 2, 2).unwrap(), [vec![1, 2], vec![3, 4]]);
        assert!(parse(ok, 3, 2).unwrap_err().contains("2 layers"));
        assert!(parse(ok, 2, 3)
            .unwrap_err()
            .contains("layer 0 has 2 experts"));
        assert!(parse("{not json", 2, 2)
            .unwrap_err()
            .contains("not an expert use file"));
        // Halda's bare or named shape without the model name reads too.
        assert!(parse(r#"{"expert_use": [[0, 1]]}"#, 1, 2).is_ok());
    }
}
