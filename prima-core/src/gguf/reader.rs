//! An open GGUF file: the mapping, plus the header, metadata and tensor index that
//! the parser (`parse.rs`) validated at open, so that these accessors cannot fail on bad bytes.
//!
//! Tensor data is never copied: [`GgufFile::tensor_data`] returns a slice of the
//! mapping. This module knows nothing of model architectures; the model layer asks it
//! for keys and tensors by name.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapMut};

use super::error::GgufError;
use super::parse::parse;
use super::tensor_info::TensorInfo;
use super::value::Value;

/// An open, validated GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    /// The open file behind `map` (none for in-memory images), kept for page-cache hints.
    file: Option<File>,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    // The metadata holds whole vocabularies; print only what identifies the file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("file_size", &self.file_size())
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` read-only and validates the whole header and tensor index.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io_err = |action, source| GgufError::Io {
            path: path.to_path_buf(),
            action,
            source,
        };
        let file = File::open(path).map_err(|e| io_err("open", e))?;
        // SAFETY: mapping a file is unsafe because another process may truncate or
        // rewrite it while it is mapped, which would change or invalidate the bytes
        // behind our slices. The engine treats model files as read-only inputs and never
        // writes them while running; concurrent modification by someone else is the
        // accepted risk of memory-mapping, the same one llama.cpp takes.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io_err("map", e))?;
        GgufFile::from_map(path.to_path_buf(), map, Some(file))
    }

    /// Parses a GGUF image held in memory, as if it had been read from `path` (which is
    /// used only in messages). The bytes are copied into a page-aligned buffer, so tensor
    /// data has the same alignment guarantees as a mapped file.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let path = path.into();
        let mut anon = MmapMut::map_anon(bytes.len()).map_err(|source| GgufError::Io {
            path: path.clone(),
            action: "allocate memory for",
            source,
        })?;
        anon.copy_from_slice(bytes);
        let map = anon.make_read_only().map_err(|source| GgufError::Io {
            path: path.clone(),
            action: "protect the memory of",
            source,
        })?;
        GgufFile::from_map(path, map, None)
    }

    fn from_map(path: PathBuf, map: Mmap, file: Option<File>) -> Result<GgufFile, GgufError> {
        let header = parse(&path, &map)?;
        Ok(GgufFile {
            path,
            map,
            file,
            version: header.version,
            alignment: header.alignment,
            data_offset: header.data_offset,
            metadata: header.metadata,
            key_index: header.key_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
        })
    }

    /// The mapping and, when the image is a file, the file (for `pages`).
    pub(super) fn map_and_file(&self) -> (&Mmap, Option<&File>) {
        (&self.map, self.file.as_ref())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where the data section starts (past the end of a file
    /// without tensors whose header is not padded to the alignment).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn file_size(&self) -> u64 {
        self.map.len() as u64
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Every key and value, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Converts a present value with `convert`, or reports it as the wrong type.
    fn get_as<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match convert(value) {
            Some(v) => Ok(Some(v)),
            None => Err(self.wrong_type(key, value, expected)),
        }
    }

    fn wrong_type(&self, key: &str, found: &Value, expected: &'static str) -> GgufError {
        GgufError::WrongType {
            path: self.path.clone(),
            key: key.to_owned(),
            found: found.type_name(),
            expected,
        }
    }

    fn missing_key(&self, key: &str) -> GgufError {
        GgufError::MissingKey {
            path: self.path.clone(),
            key: key.to_owned(),
        }
    }

    /// A non-negative integer of any width.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get_as(key, "a non-negative integer", Value::as_u64)
    }

    /// An integer of any width that fits in an i64.
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        self.get_as(key, "an integer", Value::as_i64)
    }

    /// A float or an integer.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get_as(key, "a number", Value::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get_as(key, "a bool", Value::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get_as(key, "a string", Value::as_str)
    }

    /// Converts every element of an array value with `convert`, which is given each
    /// element's index for its messages; a present non-array is the wrong type.
    fn get_array<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl Fn(usize, &'a Value) -> Result<T, GgufError>,
    ) -> Result<Option<Vec<T>>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let Some(items) = value.as_array() else {
            return Err(self.wrong_type(key, value, expected));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| convert(i, v))
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        self.get_array(key, "an array of strings", |at, v| {
            v.as_str()
                .ok_or_else(|| self.wrong_type(&format!("{key}[{at}]"), v, "a string"))
        })
    }

    /// An array of integers of any width, each of which must fit in an i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, GgufError> {
        self.get_array(key, "an array of integers", |at, v| {
            let Some(wide) = v.as_i64() else {
                // Either not an integer, or a u64 beyond i64: say which.
                return Err(match v {
                    Value::U64(big) => self.out_of_range(key, at, big, "an i32"),
                    _ => self.wrong_type(&format!("{key}[{at}]"), v, "an integer"),
                });
            };
            i32::try_from(wide).map_err(|_| self.out_of_range(key, at, &wide, "an i32"))
        })
    }

    fn out_of_range(
        &self,
        key: &str,
        at: usize,
        value: &dyn fmt::Display,
        target: &'static str,
    ) -> GgufError {
        GgufError::ValueOutOfRange {
            path: self.path.clone(),
            key: format!("{key}[{at}]"),
            value: value.to_string(),
            target,
        }
    }

    /// An array of floats or integers.
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        self.get_array(key, "an array of numbers", |at, v| {
            v.as_f32()
                .ok_or_else(|| self.wrong_type(&format!("{key}[{at}]"), v, "a number"))
        })
    }

    pub fn require_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_u64(key)?.ok_or_else(|| self.missing_key(key))
    }

    pub fn require_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.get_f32(key)?.ok_or_else(|| self.missing_key(key))
    }

    pub fn require_str(&self, key: &str) -> Result<&str, GgufError> {
        self.get_str(key)?.ok_or_else(|| self.missing_key(key))
    }

    /// `general.architecture`, which every model file must declare.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.require_str("general.architecture")
    }

    /// The tensor index, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            path: self.path.clone(),
            name: name.to_owned(),
        })
    }

    /// The bytes of a tensor, straight from the mapping.
    ///
    /// # Panics
    /// If `t` does not lie inside this file, which cannot happen for a `TensorInfo`
    /// taken from this file: bounds were checked at open.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.n_bytes).ok())
            .and_then(|(start, len)| self.map.get(start..start.checked_add(len)?))
            .unwrap_or_else(|| {
                panic!(
                    "{}: tensor '{}' [{}, +{}) is not from this file",
                    self.path.display(),
                    t.name,
                    t.offset,
                    t.n_bytes
                )
            })
    }
}
