//! Inputs that once made a fuzz target (`prima_server::fuzzing`, run by `cargo xtask fuzz`)
//! panic, replayed through the same entry points, plus the errors they now give. Each
//! test names what was wrong. The fuzzer found none of these in its runs so far;
//! reading the code around the targets did, so the inputs are GgufWriter
//! files rather than fuzzer bytes. A crash the fuzzer finds goes here with its bytes.

use prima_core::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use prima_core::model::Model;
use prima_server::fuzzing;

/// A Llama header with `extra` keys (replacing the defaults), one layer's tensors and
/// the token embedding, all F32 zeros.
fn llama(extra: &[(&str, Value)]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()))
        .add("llama.block_count", Value::U32(1))
        .add("llama.embedding_length", Value::U32(8))
        .add("llama.feed_forward_length", Value::U32(16))
        .add("llama.attention.head_count", Value::U32(2))
        .add("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    for (k, v) in extra {
        w.add(k, v.clone());
    }
    let mut t = |name: &str, dims: &[u64]| {
        w.add_tensor_unallocated(name, dims, GgmlType::F32).unwrap();
    };
    t("token_embd.weight", &[8, 4]);
    t("output_norm.weight", &[8]);
    for s in ["attn_norm", "ffn_norm"] {
        t(&format!("blk.0.{s}.weight"), &[8]);
    }
    for s in ["attn_q", "attn_k", "attn_v"] {
        t(&format!("blk.0.{s}.weight"), &[8, 8]);
    }
    t("blk.0.attn_output.weight", &[8, 8]);
    for (s, dims) in [
        ("ffn_gate", [8, 16]),
        ("ffn_up", [8, 16]),
        ("ffn_down", [16, 8]),
    ] {
        t(&format!("blk.0.{s}.weight"), &dims);
    }
    w.to_bytes()
}

/// The model error for `bytes`, which the `gguf` target must also survive.
fn load_error(bytes: &[u8]) -> String {
    fuzzing::gguf(bytes);
    let g = GgufFile::from_bytes("case.gguf", bytes).expect("the header parses");
    match Model::from_gguf(g) {
        Ok(_) => panic!("the model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_reference_file_loads() {
    let g = GgufFile::from_bytes("case.gguf", &llama(&[])).unwrap();
    Model::from_gguf(g).unwrap();
}

/// A head size of 0 (given, or `n_embd / n_head` rounded down). Found by reading, not
/// by the fuzzer: `attn_output`'s expected width divides by it, but a shape check (GGUF
/// has no zero dimensions) failed first; now the cause is named.
#[test]
fn a_zero_head_size_is_named() {
    let err = load_error(&llama(&[("llama.attention.key_length", Value::U32(0))]));
    assert!(err.contains("head size is 0"), "{err}");
    let err = load_error(&llama(&[("llama.attention.head_count", Value::U32(16))]));
    assert!(err.contains("head size is 0"), "{err}");
}

/// `n_head × head_dim` overflowed.
#[test]
fn heads_too_wide_are_an_error_not_an_overflow() {
    let err = load_error(&llama(&[
        ("llama.attention.head_count", Value::U64(1 << 40)),
        ("llama.attention.head_count_kv", Value::U64(1 << 40)),
        ("llama.attention.key_length", Value::U64(1 << 40)),
        ("llama.attention.value_length", Value::U64(1 << 40)),
        ("llama.rope.dimension_count", Value::U32(2)),
    ]));
    assert!(err.contains("too wide"), "{err}");
}

/// The layer list was allocated for `block_count` layers before any tensor was looked up.
#[test]
fn a_block_count_beyond_the_tensors_is_an_error_not_an_allocation() {
    let err = load_error(&llama(&[("llama.block_count", Value::U64(1 << 50))]));
    assert!(err.contains("but the file has only 11 tensors"), "{err}");
}

/// A file without tensors can end before its aligned data offset; the model fingerprint
/// sliced the header up to there.
#[test]
fn a_header_shorter_than_its_data_offset_is_fingerprinted() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    let mut bytes = w.to_bytes();
    // The header ends with the string "llama": cut the padding after it.
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    let g = GgufFile::from_bytes("case.gguf", &bytes).unwrap();
    assert!(
        g.data_offset() > g.file_size(),
        "the case needs an unpadded header"
    );
    fuzzing::gguf(&bytes);
}
