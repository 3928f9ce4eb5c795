//! Writer → reader round trips, and one crafted file per way a file can be refused,
//! checked by the message a person would read.

use std::path::PathBuf;

use super::*;

const PATH: &str = "models/test.gguf";

fn every_value_type() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60_000)),
        ("t.i16", Value::I16(-30_000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(1.5e-5)),
        ("t.f64", Value::F64(-2.25e300)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo ▁world".into())),
        ("t.empty_string", Value::String(String::new())),
        ("t.empty_array", Value::Array(vec![])),
        (
            "t.strings",
            Value::Array(vec![Value::String("a".into()), Value::String("".into())]),
        ),
        ("t.i32s", Value::Array(vec![Value::I32(-1), Value::I32(7)])),
        (
            "t.f32s",
            Value::Array(vec![Value::F32(0.5), Value::F32(-3.0)]),
        ),
        (
            "t.nested",
            Value::Array(vec![
                Value::Array(vec![Value::U8(1), Value::U8(2)]),
                Value::Array(vec![Value::String("x".into())]),
                Value::Array(vec![]),
            ]),
        ),
    ]
}

/// Bytes of a tensor with a recognisable pattern.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A small, valid file: architecture, every value type, and three tensors.
fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    for (k, v) in every_value_type() {
        w.add(k, v);
    }
    w.add_tensor("a0", &[8, 2], GgmlType::F32, &pattern(64, 1))
        .unwrap();
    w.add_tensor("bb", &[64, 3], GgmlType::Q4_0, &pattern(3 * 2 * 18, 2))
        .unwrap();
    w.add_tensor("ccc", &[256], GgmlType::Q6K, &pattern(210, 3))
        .unwrap();
    w
}

fn open(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(PATH, bytes)
}

fn err(bytes: &[u8]) -> String {
    match open(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            assert_eq!(e.path(), std::path::Path::new(PATH));
            e.to_string()
        }
    }
}

fn assert_msg(message: &str, expected: &str) {
    assert_eq!(message, format!("{PATH}: {expected}"));
}

/// Position of the first occurrence of `needle`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

/// Position just after the GGUF string `s` (u64 length + bytes).
fn after_str(bytes: &[u8], s: &str) -> usize {
    let mut encoded = (s.len() as u64).to_le_bytes().to_vec();
    encoded.extend_from_slice(s.as_bytes());
    find(bytes, &encoded) + encoded.len()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("prima-gguf-{}-{tag}.gguf", std::process::id()))
}

#[test]
fn every_value_type_round_trips_in_order() {
    let f = open(&sample().to_bytes()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture().unwrap(), "llama");
    let mut expected = vec![("general.architecture", Value::String("llama".into()))];
    expected.extend(every_value_type());
    let found: Vec<(&str, &Value)> = f.metadata().collect();
    assert_eq!(found.len(), expected.len());
    for ((k, v), (ek, ev)) in found.iter().zip(&expected) {
        assert_eq!((k, *v), (ek, ev));
        assert_eq!(f.get(k), Some(ev));
    }
}

#[test]
fn tensors_round_trip_through_a_file_on_disk() {
    let path = temp_path("round-trip");
    let mut w = sample();
    w.alignment(64);
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();

    assert_eq!(f.path(), path);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.get_u64("general.alignment").unwrap(), Some(64));
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.bytes().len() as u64, f.file_size());
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a0", "bb", "ccc"]);

    let a = f.require_tensor("a0").unwrap();
    assert_eq!((a.cols(), a.rows(), a.n_elements()), (8, 2, 16));
    assert_eq!(a.offset, f.data_offset());
    assert_eq!(f.tensor_data(a), pattern(64, 1));
    let bb = f.tensor("bb").unwrap();
    assert_eq!((bb.ggml_type, bb.n_bytes), (GgmlType::Q4_0, 108));
    assert_eq!(bb.offset % 64, 0);
    assert_eq!(f.tensor_data(bb), pattern(108, 2));
    let ccc = f.tensor("ccc").unwrap();
    assert_eq!((ccc.cols(), ccc.rows()), (256, 1));
    assert_eq!(f.tensor_data(ccc), pattern(210, 3));
    assert!(f.tensor("missing").is_none());
}

#[test]
fn unallocated_tensors_read_as_zeros_from_a_sparse_file() {
    let path = temp_path("sparse");
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    w.add_tensor_unallocated("big", &[4096, 1024], GgmlType::F16)
        .unwrap();
    w.add_tensor("small", &[4], GgmlType::F32, &pattern(16, 9))
        .unwrap();
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let in_memory = w.to_bytes();
    std::fs::remove_file(&path).unwrap();

    assert_eq!(f.bytes(), &in_memory[..]);
    let big = f.tensor("big").unwrap();
    assert_eq!(big.n_bytes, 4096 * 1024 * 2);
    assert!(f.tensor_data(big).iter().all(|&b| b == 0));
    assert_eq!(f.tensor_data(f.tensor("small").unwrap()), pattern(16, 9));
}

#[test]
fn writer_refuses_data_of_the_wrong_size_and_bad_shapes() {
    let mut w = GgufWriter::new();
    let e = w
        .add_tensor("t", &[32, 2], GgmlType::Q8_0, &[0; 10])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "tensor 't': data is 10 bytes, but shape [32, 2] of type Q8_0 needs 68"
    );
    assert!(w
        .add_tensor_unallocated("t", &[33], GgmlType::Q8_0)
        .is_err());
    assert!(w
        .add_tensor_unallocated("t", &[1, 1, 1, 1, 1], GgmlType::F32)
        .is_err());
    w.add_tensor_unallocated("t", &[32], GgmlType::Q8_0)
        .unwrap();
    let e = w
        .add_tensor_unallocated("t", &[32], GgmlType::Q8_0)
        .unwrap_err();
    assert_eq!(e.to_string(), "duplicate tensor name 't'");
}

#[test]
fn version_2_is_read_like_version_3() {
    let mut bytes = sample().to_bytes();
    put_u32(&mut bytes, 4, 2);
    assert_eq!(open(&bytes).unwrap().version(), 2);
}

#[test]
fn typed_getters_convert_leniently_and_name_the_wrong_type() {
    let f = open(&sample().to_bytes()).unwrap();
    assert_eq!(f.get_u64("t.u8").unwrap(), Some(200));
    assert_eq!(f.get_u64("absent").unwrap(), None);
    assert_eq!(f.get_i64("t.i32").unwrap(), Some(-2_000_000_000));
    assert_eq!(f.get_f32("t.u16").unwrap(), Some(60_000.0));
    assert_eq!(f.get_f32("t.f64").unwrap(), Some(-2.25e300f64 as f32));
    assert_eq!(f.get_bool("t.bool").unwrap(), Some(true));
    assert_eq!(f.get_str("t.string").unwrap(), Some("héllo ▁world"));
    assert_eq!(f.get_str_array("t.strings").unwrap(), Some(vec!["a", ""]));
    assert_eq!(f.get_i32_array("t.i32s").unwrap(), Some(vec![-1, 7]));
    assert_eq!(f.get_f32_array("t.i32s").unwrap(), Some(vec![-1.0, 7.0]));
    assert_eq!(f.get_f32_array("t.f32s").unwrap(), Some(vec![0.5, -3.0]));
    assert_eq!(f.get_str_array("t.empty_array").unwrap(), Some(vec![]));
    assert_eq!(f.require_u64("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.require_f32("t.f32").unwrap(), 1.5e-5);
    assert_eq!(f.require_str("t.string").unwrap(), "héllo ▁world");

    let msg = |r: Result<(), GgufError>| r.unwrap_err().to_string();
    assert_msg(
        &msg(f.get_u64("t.string").map(drop)),
        "key 't.string' is a string, expected a non-negative integer",
    );
    assert_msg(
        &msg(f.get_u64("t.i8").map(drop)),
        "key 't.i8' is an i8, expected a non-negative integer",
    );
    assert_msg(
        &msg(f.get_i64("t.u64").map(drop)),
        "key 't.u64' is a u64, expected an integer",
    );
    assert_msg(
        &msg(f.get_f32("t.bool").map(drop)),
        "key 't.bool' is a bool, expected a number",
    );
    assert_msg(
        &msg(f.get_bool("t.u8").map(drop)),
        "key 't.u8' is a u8, expected a bool",
    );
    assert_msg(
        &msg(f.get_str("t.f32").map(drop)),
        "key 't.f32' is an f32, expected a string",
    );
    assert_msg(
        &msg(f.get_str_array("t.string").map(drop)),
        "key 't.string' is a string, expected an array of strings",
    );
    assert_msg(
        &msg(f.get_str_array("t.i32s").map(drop)),
        "key 't.i32s[0]' is an i32, expected a string",
    );
    assert_msg(
        &msg(f.get_i32_array("t.strings").map(drop)),
        "key 't.strings[0]' is a string, expected an integer",
    );
    assert_msg(
        &msg(f.get_f32_array("t.nested").map(drop)),
        "key 't.nested[0]' is an array, expected a number",
    );
    assert_msg(
        &msg(f.require_u64("llama.block_count").map(drop)),
        "missing required key 'llama.block_count'",
    );
    assert_msg(
        &msg(f.require_tensor("output.weight").map(drop)),
        "missing tensor 'output.weight'",
    );
}

#[test]
fn i32_arrays_refuse_elements_out_of_range() {
    let mut w = GgufWriter::new();
    w.add(
        "u",
        Value::Array(vec![Value::U32(1), Value::U32(3_000_000_000)]),
    );
    w.add("big", Value::Array(vec![Value::U64(u64::MAX)]));
    let f = open(&w.to_bytes()).unwrap();
    let e = f.get_i32_array("u").unwrap_err().to_string();
    assert_msg(&e, "key 'u[1]' value 3000000000 does not fit in an i32");
    let e = f.get_i32_array("big").unwrap_err().to_string();
    assert_msg(
        &e,
        "key 'big[0]' value 18446744073709551615 does not fit in an i32",
    );
}

#[test]
fn architecture_is_required() {
    let f = open(&GgufWriter::new().to_bytes()).unwrap();
    assert_msg(
        &f.architecture().unwrap_err().to_string(),
        "missing required key 'general.architecture'",
    );
}

#[test]
fn a_missing_file_is_named() {
    let e = GgufFile::open("models/nope.gguf").unwrap_err();
    assert_eq!(
        e.to_string(),
        "models/nope.gguf: cannot open: No such file or directory (os error 2)"
    );
}

#[test]
fn wrong_magic_and_versions_are_refused() {
    let mut bytes = sample().to_bytes();
    bytes[..4].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    assert_msg(
        &err(&bytes),
        "not a GGUF file (magic 0x12345678, expected 'GGUF')",
    );
    for version in [1, 4, u32::MAX] {
        let mut bytes = sample().to_bytes();
        put_u32(&mut bytes, 4, version);
        assert_msg(
            &err(&bytes),
            &format!("unsupported GGUF version {version} (supported: 2, 3)"),
        );
    }
}

#[test]
fn big_endian_files_are_named_as_such() {
    let mut bytes = sample().to_bytes();
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert_msg(
        &err(&bytes),
        "big-endian GGUF file (version 3 when byte-swapped) is not supported",
    );
}

#[test]
fn open_files_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
}

#[test]
fn truncation_names_the_field_cut_short() {
    let bytes = sample().to_bytes();
    assert_msg(
        &err(&[]),
        "truncated file: header magic needs 4 bytes at offset 0 but the file ends at 0",
    );
    assert_msg(
        &err(&bytes[..10]),
        "truncated file: header tensor count needs 8 bytes at offset 8 but the file ends at 10",
    );
    let at = after_str(&bytes, "t.string") + 4 + 8;
    assert_msg(
        &err(&bytes[..at + 3]),
        &format!(
            "truncated file: value of key 't.string' needs 15 bytes at offset {at} but the file ends at {}",
            at + 3
        ),
    );
    let at = after_str(&bytes, "bb") + 4 + 16 + 4;
    assert_msg(
        &err(&bytes[..at + 5]),
        &format!(
            "truncated file: tensor info #1 'bb' (offset) needs 8 bytes at offset {at} but the file ends at {}",
            at + 5
        ),
    );
}

#[test]
fn tensor_data_past_the_end_is_refused() {
    let bytes = sample().to_bytes();
    let f = open(&bytes).unwrap();
    let ccc = f.tensor("ccc").unwrap();
    let end = ccc.offset + ccc.n_bytes;
    let cut = &bytes[..end as usize - 1];
    assert_msg(
        &err(cut),
        &format!(
            "tensor 'ccc' data [{}, {end}) lies outside the file (size {})",
            ccc.offset,
            end - 1
        ),
    );
    let mut bytes = bytes.clone();
    let at = after_str(&bytes, "ccc") + 4 + 8 + 4;
    put_u64(&mut bytes, at, u64::MAX - 31);
    let e = err(&bytes);
    assert!(
        e.contains("tensor 'ccc' data [18446744073709551615, 18446744073709551615) lies outside"),
        "{e}"
    );
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let mut bytes = sample().to_bytes();
    put_u64(&mut bytes, 16, u64::MAX);
    let e = err(&bytes);
    assert!(
        e.starts_with(&format!(
            "{PATH}: absurd metadata count 18446744073709551615 at offset 16: "
        )),
        "{e}"
    );

    let mut bytes = sample().to_bytes();
    put_u64(&mut bytes, 8, 1 << 40);
    let e = err(&bytes);
    assert!(
        e.contains("absurd tensor count 1099511627776 at offset 8"),
        "{e}"
    );

    let mut bytes = sample().to_bytes();
    let at = after_str(&bytes, "t.strings") + 4 + 4;
    put_u64(&mut bytes, at, 1 << 60);
    let e = err(&bytes);
    assert!(
        e.contains(&format!(
            "absurd array length of key 't.strings' 1152921504606846976 at offset {at}: \
             1152921504606846976 items of at least 8 bytes cannot fit"
        )),
        "{e}"
    );
}

#[test]
fn invalid_utf8_is_located() {
    let mut bytes = sample().to_bytes();
    let at = after_str(&bytes, "t.bool") - 2;
    bytes[at] = 0xFF;
    assert_msg(
        &err(&bytes),
        &format!("metadata key #11 at offset {at} is not valid UTF-8"),
    );
}

#[test]
fn unknown_value_types_are_refused() {
    let mut bytes = sample().to_bytes();
    let at = after_str(&bytes, "t.u16");
    put_u32(&mut bytes, at, 13);
    assert_msg(&err(&bytes), "key 't.u16' has unknown value type id 13");

    let mut bytes = sample().to_bytes();
    let at = after_str(&bytes, "t.i32s") + 4;
    put_u32(&mut bytes, at, 99);
    assert_msg(
        &err(&bytes),
        "array in key 't.i32s' has unknown value type id 99",
    );
}

#[test]
fn deeply_nested_arrays_are_refused() {
    let mut v = Value::U8(0);
    for _ in 0..17 {
        v = Value::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add("deep", v);
    assert_msg(
        &err(&w.to_bytes()),
        "key 'deep' nests arrays deeper than 16 levels",
    );
}

#[test]
fn duplicate_keys_and_tensor_names_are_refused() {
    let mut bytes = sample().to_bytes();
    let at = after_str(&bytes, "t.i16");
    bytes[at - 3] = b'u'; // "t.i16" becomes a second "t.u16"
    assert_msg(&err(&bytes), "duplicate metadata key 't.u16'");

    let mut w = GgufWriter::new();
    w.add_tensor("x1", &[1], GgmlType::F32, &[0; 4]).unwrap();
    w.add_tensor("x2", &[1], GgmlType::F32, &[0; 4]).unwrap();
    let mut bytes = w.to_bytes();
    let at = after_str(&bytes, "x2");
    bytes[at - 1] = b'1';
    assert_msg(&err(&bytes), "duplicate tensor name 'x1'");
}

#[test]
fn alignment_must_be_a_power_of_two_integer() {
    for (value, expected) in [
        (
            Value::U32(3),
            "general.alignment is 3, expected a non-zero power of two",
        ),
        (
            Value::U32(0),
            "general.alignment is 0, expected a non-zero power of two",
        ),
        (
            Value::String("32".into()),
            "key 'general.alignment' is a string, expected a non-negative integer",
        ),
    ] {
        let mut w = sample();
        w.add("general.alignment", value);
        assert_msg(&err(&w.to_bytes()), expected);
    }
}

/// The sample file with tensor `name`'s info patched by `patch(bytes, n_dims_offset)`.
fn with_tensor_info(name: &str, patch: impl FnOnce(&mut Vec<u8>, usize)) -> Vec<u8> {
    let mut bytes = sample().to_bytes();
    let at = after_str(&bytes, name);
    patch(&mut bytes, at);
    bytes
}

#[test]
fn bad_tensor_infos_are_refused() {
    // "bb" is [64, 3] Q4_0: n_dims at +0, dims at +4 and +12, type at +20, offset at +24.
    let bytes = with_tensor_info("bb", |b, at| put_u32(b, at, 5));
    assert_msg(
        &err(&bytes),
        "tensor 'bb' has 5 dimensions (at most 4 supported)",
    );

    let bytes = with_tensor_info("bb", |b, at| put_u64(b, at + 12, 0));
    assert_msg(
        &err(&bytes),
        "tensor 'bb' has a zero dimension in shape [64, 0]",
    );

    let bytes = with_tensor_info("bb", |b, at| put_u32(b, at + 20, 99));
    assert_msg(&err(&bytes), "tensor 'bb' has unknown type id 99");

    let bytes = with_tensor_info("bb", |b, at| put_u64(b, at + 4, 48));
    assert_msg(
        &err(&bytes),
        "tensor 'bb' of type Q4_0 has row length 48, not a multiple of its block size 32",
    );

    let bytes = with_tensor_info("bb", |b, at| {
        put_u64(b, at + 4, 1 << 40);
        put_u64(b, at + 12, 1 << 40);
    });
    assert_msg(
        &err(&bytes),
        "tensor 'bb' shape [1099511627776, 1099511627776] overflows the element or byte count",
    );

    // Elements fit in u64 but bytes do not: F32 is 4 bytes each.
    let bytes = with_tensor_info("a0", |b, at| {
        put_u64(b, at + 4, 1 << 62);
        put_u64(b, at + 12, 1);
    });
    assert!(err(&bytes).contains("overflows the element or byte count"));

    let bytes = with_tensor_info("bb", |b, at| put_u64(b, at + 24, 4));
    assert_msg(
        &err(&bytes),
        "tensor 'bb' offset 4 is not a multiple of the alignment 32",
    );
}

#[test]
fn bad_shape_reads_like_the_others() {
    let e = GgufError::BadShape {
        path: PATH.into(),
        tensor: "blk.0.attn_q.weight".into(),
        found: vec![576, 192],
        expected: vec![576, 576],
    };
    assert_msg(
        &e.to_string(),
        "tensor 'blk.0.attn_q.weight' has shape [576, 192], expected [576, 576]",
    );
}

#[test]
fn names_from_the_file_are_shown_on_one_line() {
    let long = "k".repeat(200);
    let mut w = GgufWriter::new();
    w.add("bad\nkey", Value::U8(0));
    w.add(&long, Value::U8(0));
    let mut bytes = w.to_bytes();
    let at = after_str(&bytes, "bad\nkey");
    put_u32(&mut bytes, at, 77);
    assert_msg(&err(&bytes), "key 'bad\\nkey' has unknown value type id 77");

    let mut bytes = w.to_bytes();
    let at = after_str(&bytes, &long);
    put_u32(&mut bytes, at, 77);
    let shown = format!("{}…", "k".repeat(96));
    assert_msg(
        &err(&bytes),
        &format!("key '{shown}' has unknown value type id 77"),
    );
}
