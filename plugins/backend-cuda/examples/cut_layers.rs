//! Writes a model's first N layers as a GGUF of its own: the real weights of the kept
//! layers, the embedding, output norm and head unchanged, `<arch>.block_count` set to N.
//! GPU machines take little per call, so the real-weight comparisons in tests/gpu.rs
//! (`PRIMA_GPU_REAL_MODELS`) run on such cuts.
//!
//! `cargo run --release -p prima-backend-cuda --example cut_layers -- IN.gguf N OUT.gguf`

use prima_core::gguf::{GgufFile, GgufWriter, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, layers, output] = args.as_slice() else {
        return Err("usage: cut_layers IN.gguf N OUT.gguf".into());
    };
    let keep: u64 = layers.parse()?;
    let file = GgufFile::open(input)?;
    let arch = file.architecture()?.to_string();
    let block_count_key = format!("{arch}.block_count");
    let had = file.require_u64(&block_count_key)?;
    if keep == 0 || keep > had {
        return Err(format!("{input} has {had} layers; cannot keep {keep}").into());
    }
    let mut w = GgufWriter::new();
    w.alignment(file.alignment());
    for (key, value) in file.metadata() {
        if key == block_count_key {
            w.add(key, Value::U32(keep as u32));
        } else if key != "general.alignment" {
            w.add(key, value.clone());
        }
    }
    let mut kept = 0;
    for t in file.tensors() {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<u64>().ok());
        if layer.is_some_and(|l| l >= keep) {
            continue;
        }
        w.add_tensor(&t.name, &t.dims, t.ggml_type, file.tensor_data(t))?;
        kept += 1;
    }
    w.write(output)?;
    eprintln!(
        "{output}: {kept} of {} tensors, {keep} of {had} layers",
        file.tensors().len()
    );
    Ok(())
}
