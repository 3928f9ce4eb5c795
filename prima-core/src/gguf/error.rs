//! The ways a GGUF file can be unreadable or unsuitable, each naming the file and the
//! exact field, key or tensor at fault.
//!
//! Every message is one line that starts with the file path, so the binary can print it
//! as-is. The model layer builds [`GgufError::BadShape`] and
//! [`GgufError::MissingTensor`] itself when a file lacks what an architecture needs.

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a GGUF file could not be opened, parsed, or used.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        /// What was being attempted: "open", "map", "read the size of".
        action: &'static str,
        #[source]
        source: io::Error,
    },

    #[error(
        "{}: truncated file: {what} needs {needed} bytes at offset {offset} but the file ends at {file_size}",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        what: String,
        needed: u64,
        offset: u64,
        file_size: u64,
    },

    #[error("{}: not a GGUF file (magic 0x{magic:08x}, expected 'GGUF')", path.display())]
    BadMagic { path: PathBuf, magic: u32 },

    #[error("{}: unsupported GGUF version {version} (supported: 2, 3)", path.display())]
    UnsupportedVersion { path: PathBuf, version: u32 },

    #[error(
        "{}: big-endian GGUF file (version {version} when byte-swapped) is not supported",
        path.display()
    )]
    BigEndian { path: PathBuf, version: u32 },

    /// A count (of keys, tensors or array elements) larger than the rest of the file
    /// could hold even at the smallest encoding of each item.
    #[error(
        "{}: absurd {what} {count} at offset {offset}: {count} items of at least {min_item_bytes} bytes cannot fit in the remaining {remaining} bytes",
        path.display()
    )]
    CountTooLarge {
        path: PathBuf,
        what: String,
        count: u64,
        min_item_bytes: u64,
        offset: u64,
        remaining: u64,
    },

    #[error("{}: {what} at offset {offset} is not valid UTF-8", path.display())]
    InvalidUtf8 {
        path: PathBuf,
        what: String,
        offset: u64,
    },

    #[error("{}: {what} has unknown value type id {type_id}", path.display())]
    UnknownValueType {
        path: PathBuf,
        what: String,
        type_id: u32,
    },

    #[error(
        "{}: key '{key}' nests arrays deeper than {max_depth} levels",
        path.display(), key = printable(key))]
    NestingTooDeep {
        path: PathBuf,
        key: String,
        max_depth: usize,
    },

    #[error("{}: duplicate metadata key '{key}'", path.display(), key = printable(key))]
    DuplicateKey { path: PathBuf, key: String },

    #[error("{}: duplicate tensor name '{name}'", path.display(), name = printable(name))]
    DuplicateTensor { path: PathBuf, name: String },

    #[error(
        "{}: general.alignment is {alignment}, expected a non-zero power of two",
        path.display()
    )]
    BadAlignment { path: PathBuf, alignment: u64 },

    #[error("{}: tensor '{tensor}' has {n_dims} dimensions (at most {max} supported)", path.display(), tensor = printable(tensor))]
    TooManyDims {
        path: PathBuf,
        tensor: String,
        n_dims: u32,
        max: u32,
    },

    #[error("{}: tensor '{tensor}' has a zero dimension in shape {dims:?}", path.display(), tensor = printable(tensor))]
    ZeroDim {
        path: PathBuf,
        tensor: String,
        dims: Vec<u64>,
    },

    #[error("{}: tensor '{tensor}' has unknown type id {type_id}", path.display(), tensor = printable(tensor))]
    UnknownTensorType {
        path: PathBuf,
        tensor: String,
        type_id: u32,
    },

    #[error(
        "{}: tensor '{tensor}' of type {ggml_type} has row length {cols}, not a multiple of its block size {block_elems}",
        path.display(), tensor = printable(tensor))]
    RowNotBlockMultiple {
        path: PathBuf,
        tensor: String,
        ggml_type: super::GgmlType,
        cols: u64,
        block_elems: u64,
    },

    #[error(
        "{}: tensor '{tensor}' shape {dims:?} overflows the element or byte count",
        path.display(), tensor = printable(tensor))]
    SizeOverflow {
        path: PathBuf,
        tensor: String,
        dims: Vec<u64>,
    },

    #[error(
        "{}: tensor '{tensor}' offset {offset} is not a multiple of the alignment {alignment}",
        path.display(), tensor = printable(tensor))]
    MisalignedTensor {
        path: PathBuf,
        tensor: String,
        /// The offset as stored, relative to the data section.
        offset: u64,
        alignment: u64,
    },

    /// `start` and `end` are absolute file offsets; `end` saturates when the sum overflows.
    #[error(
        "{}: tensor '{tensor}' data [{start}, {end}) lies outside the file (size {file_size})",
        path.display(), tensor = printable(tensor))]
    TensorOutOfBounds {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        file_size: u64,
    },

    #[error("{}: missing required key '{key}'", path.display(), key = printable(key))]
    MissingKey { path: PathBuf, key: String },

    /// `found` is a [`super::Value::type_name`]; `expected` reads as a noun phrase with
    /// its article ("an integer", "a string").
    #[error(
        "{}: key '{key}' is {} {found}, expected {expected}",
        path.display(),
        article(found), key = printable(key))]
    WrongType {
        path: PathBuf,
        key: String,
        found: &'static str,
        expected: &'static str,
    },

    #[error("{}: key '{key}' value {value} does not fit in {target}", path.display(), key = printable(key))]
    ValueOutOfRange {
        path: PathBuf,
        key: String,
        value: String,
        target: &'static str,
    },

    #[error("{}: missing tensor '{name}'", path.display(), name = printable(name))]
    MissingTensor { path: PathBuf, name: String },

    #[error(
        "{}: tensor '{tensor}' has shape {found:?}, expected {expected:?}",
        path.display(), tensor = printable(tensor))]
    BadShape {
        path: PathBuf,
        tensor: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
}

impl GgufError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            GgufError::Io { path, .. }
            | GgufError::Truncated { path, .. }
            | GgufError::BadMagic { path, .. }
            | GgufError::UnsupportedVersion { path, .. }
            | GgufError::BigEndian { path, .. }
            | GgufError::CountTooLarge { path, .. }
            | GgufError::InvalidUtf8 { path, .. }
            | GgufError::UnknownValueType { path, .. }
            | GgufError::NestingTooDeep { path, .. }
            | GgufError::DuplicateKey { path, .. }
            | GgufError::DuplicateTensor { path, .. }
            | GgufError::BadAlignment { path, .. }
            | GgufError::TooManyDims { path, .. }
            | GgufError::ZeroDim { path, .. }
            | GgufError::UnknownTensorType { path, .. }
            | GgufError::RowNotBlockMultiple { path, .. }
            | GgufError::SizeOverflow { path, .. }
            | GgufError::MisalignedTensor { path, .. }
            | GgufError::TensorOutOfBounds { path, .. }
            | GgufError::MissingKey { path, .. }
            | GgufError::WrongType { path, .. }
            | GgufError::ValueOutOfRange { path, .. }
            | GgufError::MissingTensor { path, .. }
            | GgufError::BadShape { path, .. } => path,
        }
    }
}

/// Shows a key or tensor name from the file on one line: control characters escaped,
/// and long (likely corrupt) names cut short.
pub(crate) fn printable(name: &str) -> Printable<'_> {
    Printable(name)
}

pub(crate) struct Printable<'a>(&'a str);

impl std::fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MAX_CHARS: usize = 96;
        for (i, c) in self.0.chars().enumerate() {
            if i == MAX_CHARS {
                return f.write_str("…");
            }
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// "a" or "an" before a type name as it is read aloud ("an i32", "an f32", "a u32").
fn article(word: &str) -> &'static str {
    match word.as_bytes().first() {
        Some(b'a' | b'e' | b'i' | b'o' | b'f') => "an",
        _ => "a",
    }
}
