//! Bad input to the real `prima` binary: each case must exit non-zero with one line on
//! stderr that names the problem, and never panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use prima_core::gguf::{GgmlType, GgufWriter, Value};

const N_EMBD: u64 = 64;
const N_FF: u64 = 128;
const N_VOCAB: u64 = 8;

/// A complete, structurally valid one-layer llama model with F32 weights and a tiny
/// byte-level BPE vocabulary; `arch` and the shape of `attn_q` can be changed.
fn tiny_model(arch: &str, attn_q_dims: [u64; 2]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let s = |x: &str| Value::String(x.into());
    w.add("general.architecture", s(arch));
    for (k, v) in [
        ("block_count", 1u32),
        ("context_length", 64),
        ("embedding_length", N_EMBD as u32),
        ("feed_forward_length", N_FF as u32),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
    ] {
        w.add(&format!("{arch}.{k}"), Value::U32(v));
    }
    w.add(
        &format!("{arch}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    w.add("tokenizer.ggml.model", s("gpt2"));
    w.add("tokenizer.ggml.pre", s("default"));
    let tokens = ["<s>", "</s>", "h", "i", "hi", "Ġ", "Ġh", "!"];
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
        Value::Array(vec![s("h i"), s("Ġ h")]),
    );
    w.add("tokenizer.ggml.bos_token_id", Value::U32(0));
    w.add("tokenizer.ggml.eos_token_id", Value::U32(1));

    let mut tensor = |name: &str, dims: &[u64]| {
        let n: u64 = dims.iter().product();
        let data: Vec<u8> = (0..n)
            .flat_map(|i| (((i % 13) as f32 - 6.0) * 0.01).to_le_bytes())
            .collect();
        w.add_tensor(name, dims, GgmlType::F32, &data).unwrap();
    };
    let kv = N_EMBD / 2;
    tensor("token_embd.weight", &[N_EMBD, N_VOCAB]);
    tensor("output_norm.weight", &[N_EMBD]);
    tensor("blk.0.attn_norm.weight", &[N_EMBD]);
    tensor("blk.0.attn_q.weight", &attn_q_dims);
    tensor("blk.0.attn_k.weight", &[N_EMBD, kv]);
    tensor("blk.0.attn_v.weight", &[N_EMBD, kv]);
    tensor("blk.0.attn_output.weight", &[N_EMBD, N_EMBD]);
    tensor("blk.0.ffn_norm.weight", &[N_EMBD]);
    tensor("blk.0.ffn_gate.weight", &[N_EMBD, N_FF]);
    tensor("blk.0.ffn_up.weight", &[N_EMBD, N_FF]);
    tensor("blk.0.ffn_down.weight", &[N_FF, N_EMBD]);
    w.to_bytes()
}

fn valid_model() -> Vec<u8> {
    tiny_model("llama", [N_EMBD, N_EMBD])
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prima-cli-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs `prima run` on `model` and returns stderr, asserting the failure is clean.
fn run_fails(model: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["run", "-m"])
        .arg(model)
        .args(["-p", "hi", "-n", "2", "--temp", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "exit status, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one line expected: {stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout expected");
    stderr
}

/// Byte offset of the u32 type id in the tensor info of `name`.
fn tensor_type_offset(bytes: &[u8], name: &str) -> usize {
    let pos = bytes
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .unwrap();
    let after_name = pos + name.len();
    let n_dims = u32::from_le_bytes(bytes[after_name..after_name + 4].try_into().unwrap());
    after_name + 4 + 8 * n_dims as usize
}

#[test]
fn the_valid_tiny_model_runs() {
    // The baseline the other cases corrupt: it must load and generate (needs the plugin).
    let path = write("valid.gguf", &valid_model());
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["run", "-m"])
        .arg(&path)
        .args(["-p", "hi", "-n", "3", "--temp", "0", "--ignore-eos"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn missing_file() {
    let err = run_fails(Path::new("/nonexistent/model.gguf"));
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    assert!(err.contains("No such file"), "{err}");
}

#[test]
fn wrong_magic() {
    let mut bytes = valid_model();
    bytes[..4].copy_from_slice(b"GGML");
    let path = write("magic.gguf", &bytes);
    let err = run_fails(&path);
    assert!(err.contains("not a GGUF file"), "{err}");
    assert!(err.contains("magic.gguf"), "{err}");
}

#[test]
fn truncated_file() {
    let bytes = valid_model();
    for (i, cut) in [10, bytes.len() / 3, bytes.len() - 100]
        .into_iter()
        .enumerate()
    {
        let path = write(&format!("truncated-{i}.gguf"), &bytes[..cut]);
        let err = run_fails(&path);
        assert!(
            err.contains("truncated") || err.contains("outside the file"),
            "cut at {cut}: {err}"
        );
    }
}

#[test]
fn tensor_out_of_range() {
    let bytes = valid_model();
    // Cut inside the last tensor's data: the header parses, the tensor does not fit.
    let path = write("oob.gguf", &bytes[..bytes.len() - 16]);
    let err = run_fails(&path);
    assert!(err.contains("blk.0.ffn_down.weight"), "{err}");
    assert!(err.contains("outside the file"), "{err}");
}

#[test]
fn unsupported_architecture() {
    let path = write("arch.gguf", &tiny_model("mamba", [N_EMBD, N_EMBD]));
    let err = run_fails(&path);
    assert!(err.contains("unsupported architecture 'mamba'"), "{err}");
}

#[test]
fn unsupported_tensor_type() {
    let mut bytes = valid_model();
    let at = tensor_type_offset(&bytes, "blk.0.attn_k.weight");
    bytes[at..at + 4].copy_from_slice(&16u32.to_le_bytes()); // IQ2_XXS: this engine lacks it
    let path = write("type.gguf", &bytes);
    let err = run_fails(&path);
    assert!(err.contains("blk.0.attn_k.weight"), "{err}");
    assert!(err.contains("unknown type id 16"), "{err}");
}

#[test]
fn tensor_shape_that_does_not_fit_the_architecture() {
    let path = write("shape.gguf", &tiny_model("llama", [N_EMBD, N_EMBD / 2]));
    let err = run_fails(&path);
    assert!(err.contains("blk.0.attn_q.weight"), "{err}");
    assert!(err.contains("expected [64, 64]"), "{err}");
}
