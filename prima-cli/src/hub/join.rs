//! Joins a split model (llama.cpp's `gguf-split`: each part a GGUF file of its own, the
//! metadata in the first, `split.*` keys in each) into one GGUF file, since the engine
//! maps one file. The tensors keep their order; their bytes are copied from the parts'
//! mappings straight to their place in the output, never held in memory whole.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::Context;
use prima_core::gguf::{GgufFile, GgufWriter};

/// Writes the parts, in order, as one file at `out` (through `out.tmp`, renamed at the end).
pub fn join(parts: &[&Path], out: &Path) -> anyhow::Result<()> {
    let files = parts
        .iter()
        .map(|p| {
            GgufFile::open(p).with_context(|| format!("joining the split model: {}", p.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (i, f) in files.iter().enumerate() {
        let no = f.get_u64("split.no").ok().flatten();
        let count = f.get_u64("split.count").ok().flatten();
        if no.is_some_and(|n| n != i as u64) || count.is_some_and(|c| c != files.len() as u64) {
            anyhow::bail!(
                "{}: split.no {no:?} of split.count {count:?}, but it is part {} of {}",
                f.path().display(),
                i + 1,
                files.len()
            );
        }
    }
    let first = &files[0];
    let mut writer = GgufWriter::new();
    if first.get("general.alignment").is_some() {
        writer.alignment(first.alignment());
    }
    for (key, value) in first.metadata().filter(|(k, _)| !k.starts_with("split.")) {
        writer.add(key, value.clone());
    }
    for f in &files {
        for t in f.tensors() {
            writer
                .add_tensor_unallocated(&t.name, &t.dims, t.ggml_type)
                .with_context(|| format!("joining {}", f.path().display()))?;
        }
    }
    let tmp = out.with_extension("gguf.tmp");
    writer
        .write(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    // The layout the writer chose, read back: where each tensor's bytes go.
    let layout = GgufFile::open(&tmp)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    for f in &files {
        for t in f.tensors() {
            let place = layout.tensor(&t.name).with_context(|| {
                format!("{}: tensor {} lost in the join", tmp.display(), t.name)
            })?;
            file.seek(SeekFrom::Start(place.offset))?;
            file.write_all(f.tensor_data(t))
                .with_context(|| format!("writing {}", tmp.display()))?;
        }
    }
    file.sync_all()?;
    drop(file);
    drop(layout);
    std::fs::rename(&tmp, out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    Ok(())
}
