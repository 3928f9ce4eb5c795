//! Corrupted and truncated GGUF files must be refused with an error, never a panic or a
//! hang, and a file that does open must be safe to read in full.
//!
//! Two subjects: a small model-like file built with `GgufWriter`, mutated at every
//! header byte and truncated at every length; and the real SmolLM2 model (when the
//! xtask has downloaded it), mutated at a stride over its first 64 KiB.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use prima_core::gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "prima-gguf-corruption-{}-{tag}.gguf",
        std::process::id()
    ))
}

/// Reads everything an opened file offers, the way a model loader would.
fn read_everything(f: &GgufFile) {
    fn walk(v: &Value) -> usize {
        match v {
            Value::String(s) => s.len(),
            Value::Array(items) => items.iter().map(walk).sum(),
            other => other.type_name().len(),
        }
    }
    let mut touched = 0usize;
    for (key, value) in f.metadata() {
        touched += walk(value);
        // The typed getters may refuse, but must not panic.
        let _ = f.get_u64(key);
        let _ = f.get_i64(key);
        let _ = f.get_f32(key);
        let _ = f.get_bool(key);
        let _ = f.get_str(key);
        let _ = f.get_str_array(key);
        let _ = f.get_i32_array(key);
        let _ = f.get_f32_array(key);
    }
    let _ = f.architecture();
    for t in f.tensors() {
        let data = f.tensor_data(t);
        assert_eq!(data.len() as u64, t.n_bytes);
        assert!(t.offset >= f.data_offset() && t.offset % f.alignment() == 0);
        assert!(std::ptr::eq(f.tensor(&t.name).unwrap(), t));
        // Touch the ends rather than every byte: the real model's data is 98 MB.
        touched += usize::from(data[0]) + usize::from(data[data.len() - 1]);
    }
    std::hint::black_box(touched);
}

/// Whether opening gave a file (then read in full) or an error naming `path`.
fn check(result: Result<GgufFile, GgufError>, path: &Path) -> bool {
    match result {
        Ok(f) => {
            read_everything(&f);
            true
        }
        Err(e) => {
            assert_eq!(e.path(), path);
            let message = e.to_string();
            assert!(
                message.starts_with(&path.display().to_string()),
                "{message}"
            );
            assert!(!message.contains('\n'), "{message}");
            false
        }
    }
}

/// The values written over a byte: zero, all ones, and one more than it was.
fn mutations(original: u8) -> impl Iterator<Item = u8> {
    let mut values = vec![0x00, 0xFF, original.wrapping_add(1)];
    values.retain(|&v| v != original);
    values.dedup();
    values.into_iter()
}

/// A few KB shaped like a llama model: typical keys, a tiny vocabulary, and tensors of
/// assorted types.
fn small_model() -> Vec<u8> {
    let mut w = GgufWriter::new();
    let s = |x: &str| Value::String(x.into());
    w.add("general.architecture", s("llama"));
    w.add("general.name", s("tiny"));
    w.add("general.file_type", Value::U32(3));
    w.add("general.quantization_version", Value::U32(2));
    w.add("llama.block_count", Value::U32(2));
    w.add("llama.context_length", Value::U32(256));
    w.add("llama.embedding_length", Value::U32(64));
    w.add("llama.feed_forward_length", Value::U32(128));
    w.add("llama.attention.head_count", Value::U32(4));
    w.add("llama.attention.head_count_kv", Value::U32(2));
    w.add("llama.rope.freq_base", Value::F32(10000.0));
    w.add("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.add("llama.vocab_size", Value::U64(8));
    w.add("tokenizer.ggml.model", s("gpt2"));
    let tokens = ["<s>", "</s>", "a", "b", "ab", "Ġ", "Ġa", "é"];
    w.add(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.iter().map(|t| s(t)).collect()),
    );
    w.add(
        "tokenizer.ggml.token_type",
        Value::Array(
            [3, 3, 1, 1, 1, 1, 1, 1]
                .into_iter()
                .map(Value::I32)
                .collect(),
        ),
    );
    w.add(
        "tokenizer.ggml.merges",
        Value::Array(vec![s("a b"), s("Ġ a")]),
    );
    w.add(
        "tokenizer.ggml.scores",
        Value::Array(vec![Value::F32(0.0); 8]),
    );
    w.add("tokenizer.ggml.bos_token_id", Value::U32(0));
    w.add("tokenizer.ggml.eos_token_id", Value::U32(1));
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(true));
    w.add(
        "test.nested",
        Value::Array(vec![
            Value::Array(vec![Value::I64(-1)]),
            Value::Array(vec![]),
        ]),
    );
    w.add("tokenizer.chat_template", s("{{ messages }}"));

    let tensors: [(&str, &[u64], GgmlType); 10] = [
        ("token_embd.weight", &[64, 8], GgmlType::Q4_1),
        ("output_norm.weight", &[64], GgmlType::F32),
        ("blk.0.attn_norm.weight", &[64], GgmlType::F32),
        ("blk.0.attn_q.weight", &[64, 4], GgmlType::Q8_0),
        ("blk.0.attn_k.weight", &[64, 2], GgmlType::F16),
        ("blk.0.attn_v.weight", &[32, 2], GgmlType::Q5_0),
        ("blk.0.ffn_up.weight", &[256, 2], GgmlType::Q4K),
        ("blk.0.ffn_down.weight", &[256], GgmlType::Q6K),
        ("blk.1.ffn_gate.weight", &[16, 2, 2], GgmlType::BF16),
        ("output.weight", &[32, 2, 1, 2], GgmlType::Q4_0),
    ];
    for (i, (name, dims, ty)) in tensors.into_iter().enumerate() {
        let rows: u64 = dims[1..].iter().product();
        let cols = dims[0] as usize;
        let n = rows as usize * cols / ty.block_elems() * ty.block_bytes();
        let data: Vec<u8> = (0..n).map(|j| (j * 7 + i) as u8).collect();
        w.add_tensor(name, dims, ty, &data).unwrap();
    }
    w.to_bytes()
}

#[test]
fn gguf_small_model_survives_every_byte_mutation_and_truncation() {
    let bytes = small_model();
    let path = Path::new("synthetic/small.gguf");
    let original = GgufFile::from_bytes(path, &bytes).unwrap();
    read_everything(&original);
    assert_eq!(original.tensors().len(), 10);
    assert!(original.metadata().count() >= 20);
    let header_len = original.data_offset() as usize;
    assert!(bytes.len() > 2000, "{} bytes", bytes.len());

    let (mut opened, mut refused) = (0, 0);
    let mut copy = bytes.clone();
    for i in 0..header_len {
        for v in mutations(bytes[i]) {
            copy[i] = v;
            match check(GgufFile::from_bytes(path, &copy), path) {
                true => opened += 1,
                false => refused += 1,
            }
        }
        copy[i] = bytes[i];
    }
    for len in 0..=bytes.len() {
        let ok = check(GgufFile::from_bytes(path, &bytes[..len]), path);
        // Only the data section's trailing padding may be cut away.
        let last_end = original
            .tensors()
            .iter()
            .map(|t| t.offset + t.n_bytes)
            .max()
            .unwrap();
        assert_eq!(ok, len as u64 >= last_end, "truncated at {len}");
    }
    // Most mutations of a header land in strings and are harmless; structure bytes are not.
    assert!(
        opened > 0 && refused > 0,
        "{opened} opened, {refused} refused"
    );
}

const REAL_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn real_model() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(REAL_MODEL);
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "note: {} is absent (the xtask downloads it); skipping the real-model checks",
            path.display()
        );
        None
    }
}

/// Position of the first occurrence of `needle`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

/// A copy of the real model whose header is real and whose data section is a hole of
/// the same size: opens like the original, costs only the header in disk writes.
fn sparse_copy(bytes: &[u8], header_len: usize, tag: &str) -> (PathBuf, File) {
    let path = temp_path(tag);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.write_all_at(&bytes[..header_len], 0).unwrap();
    file.set_len(bytes.len() as u64).unwrap();
    (path, file)
}

#[test]
fn gguf_real_model_opens_and_survives_mutation() {
    let Some(model) = real_model() else { return };
    let f = GgufFile::open(&model).unwrap();
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.require_u64("llama.block_count").unwrap(), 30);
    assert!(!f.tensors().is_empty());
    read_everything(&f);

    let bytes = f.bytes();
    let header_len = f.data_offset() as usize;
    let region = header_len.min(64 * 1024);
    let (path, file) = sparse_copy(bytes, header_len, "mutate");
    let start = Instant::now();
    let mut opens = 0;
    // Each open parses the whole 49k-token vocabulary (several ms), so the budget is a
    // few thousand opens: every byte of the fixed header and first key, every third byte
    // through the scalar keys and the start of the token list (every field is at least
    // 4 bytes wide, so each is hit), then a prime stride to 64 KiB.
    let tokens = find(bytes, b"tokenizer.ggml.tokens");
    let dense = (tokens + 512).min(region);
    let positions = (0..64)
        .chain((64..dense).step_by(3))
        .chain((dense..region).step_by(193));
    for i in positions {
        for v in mutations(bytes[i]) {
            file.write_all_at(&[v], i as u64).unwrap();
            check(GgufFile::open(&path), &path);
            opens += 1;
        }
        file.write_all_at(&bytes[i..i + 1], i as u64).unwrap();
    }
    eprintln!("{opens} mutated opens in {:?}", start.elapsed());
    drop(file);
    std::fs::remove_file(&path).unwrap();

    // Truncations: ~200 through the header region, a few in the data section.
    let start = Instant::now();
    let path = temp_path("truncate");
    let mut lengths: Vec<usize> = (0..200).map(|k| k * header_len / 200).collect();
    lengths.extend([0, 1, 3, 4, 7, 8, 15, 16, 23, 24, header_len - 1, header_len]);
    lengths.extend([
        header_len + 1,
        header_len + 4096,
        bytes.len() / 2,
        bytes.len() - 1,
    ]);
    for len in lengths {
        let file = File::create(&path).unwrap();
        file.write_all_at(&bytes[..len.min(header_len)], 0).unwrap();
        file.set_len(len as u64).unwrap();
        drop(file);
        let ok = check(GgufFile::open(&path), &path);
        assert!(!ok, "a copy truncated to {len} bytes opened");
    }
    eprintln!("truncated opens in {:?}", start.elapsed());
    std::fs::remove_file(&path).unwrap();
}
