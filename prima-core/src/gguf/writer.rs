//! Builds GGUF v3 files, for tests and tools (synthetic models, fixtures).
//!
//! Not a converter: it writes exactly the keys and tensors it is given, laid out the
//! way llama.cpp lays them out (each tensor at an aligned offset, padded to the
//! alignment), so the reader can be tested against files whose every byte is known.

use std::fs::OpenOptions;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;

use super::parse::{tensor_bytes, DEFAULT_ALIGNMENT, MAX_DIMS};
use super::value::{type_id, Value};
use super::GgmlType;

/// Collects metadata and tensors, then writes them as one GGUF v3 image.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    n_bytes: u64,
    /// `None` for a tensor whose data region is left as a hole (zeros).
    data: Option<Vec<u8>>,
}

/// The serialized header and where each tensor goes.
struct Layout {
    header: Vec<u8>,
    data_offset: u64,
    /// Offset of each tensor relative to `data_offset`, in `tensors` order.
    offsets: Vec<u64>,
    file_size: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the data alignment and records it as `general.alignment`.
    ///
    /// # Panics
    /// If `alignment` is not a non-zero power of two.
    pub fn alignment(&mut self, alignment: u64) -> &mut Self {
        assert!(
            alignment.is_power_of_two(),
            "GGUF alignment must be a non-zero power of two, not {alignment}"
        );
        self.alignment = alignment;
        let value = match u32::try_from(alignment) {
            Ok(a) => Value::U32(a),
            Err(_) => Value::U64(alignment),
        };
        self.add("general.alignment", value)
    }

    /// Adds a metadata key, or replaces its value (keeping its position) if present.
    ///
    /// The layout alignment is only changed by [`GgufWriter::alignment`]; adding
    /// `general.alignment` directly writes that value as-is, which lets tests build
    /// files with a bad alignment.
    ///
    /// # Panics
    /// If an array mixes element types, which GGUF cannot represent.
    pub fn add(&mut self, key: &str, value: Value) -> &mut Self {
        assert!(
            is_homogeneous(&value),
            "GGUF arrays hold one element type; key '{key}' mixes several"
        );
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Adds a tensor with its data, which must be exactly the size its shape and type
    /// call for.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
        data: &[u8],
    ) -> io::Result<&mut Self> {
        let n_bytes = self.check_tensor(name, dims, ggml_type)?;
        if data.len() as u64 != n_bytes {
            return Err(invalid(format!(
                "tensor '{name}': data is {} bytes, but shape {dims:?} of type {ggml_type} needs {n_bytes}",
                data.len()
            )));
        }
        self.push_tensor(name, dims, ggml_type, n_bytes, Some(data.to_vec()));
        Ok(self)
    }

    /// Adds a tensor whose data is never written: [`GgufWriter::write`] leaves its
    /// region as a hole in a sparse file, and [`GgufWriter::to_bytes`] fills it with
    /// zeros. For synthetic models whose weights do not matter.
    pub fn add_tensor_unallocated(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
    ) -> io::Result<&mut Self> {
        let n_bytes = self.check_tensor(name, dims, ggml_type)?;
        self.push_tensor(name, dims, ggml_type, n_bytes, None);
        Ok(self)
    }

    fn check_tensor(&self, name: &str, dims: &[u64], ggml_type: GgmlType) -> io::Result<u64> {
        if dims.len() > MAX_DIMS as usize {
            return Err(invalid(format!(
                "tensor '{name}': {} dimensions, at most {MAX_DIMS} supported",
                dims.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(invalid(format!("duplicate tensor name '{name}'")));
        }
        tensor_bytes(Path::new("<gguf writer>"), name, dims, ggml_type)
            .map_err(|e| invalid(e.to_string()))
    }

    fn push_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
        n_bytes: u64,
        data: Option<Vec<u8>>,
    ) {
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ggml_type,
            n_bytes,
            data,
        });
    }

    fn layout(&self) -> Layout {
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut next = 0u64;
        for t in &self.tensors {
            offsets.push(next);
            next = align_up(next + t.n_bytes, self.alignment);
        }

        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        put_u32(&mut h, 3);
        put_u64(&mut h, self.tensors.len() as u64);
        put_u64(&mut h, self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            put_str(&mut h, key);
            put_u32(&mut h, value.type_id());
            put_value(&mut h, value);
        }
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            put_str(&mut h, &t.name);
            put_u32(&mut h, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut h, d);
            }
            put_u32(&mut h, t.ggml_type.id());
            put_u64(&mut h, offset);
        }
        let data_offset = align_up(h.len() as u64, self.alignment);
        Layout {
            header: h,
            data_offset,
            offsets,
            file_size: data_offset + next,
        }
    }

    /// The whole file in memory, unallocated tensors as zeros.
    pub fn to_bytes(&self) -> Vec<u8> {
        let layout = self.layout();
        let mut out = layout.header;
        out.resize(layout.file_size as usize, 0);
        for (t, &offset) in self.tensors.iter().zip(&layout.offsets) {
            if let Some(data) = &t.data {
                let start = (layout.data_offset + offset) as usize;
                out[start..start + data.len()].copy_from_slice(data);
            }
        }
        out
    }

    /// Writes the file to `path`, leaving padding and unallocated tensors as holes.
    pub fn write(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let layout = self.layout();
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.write_all(&layout.header)?;
        for (t, &offset) in self.tensors.iter().zip(&layout.offsets) {
            if let Some(data) = &t.data {
                file.seek(SeekFrom::Start(layout.data_offset + offset))?;
                file.write_all(data)?;
            }
        }
        file.set_len(layout.file_size)?;
        file.flush()
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn align_up(n: u64, alignment: u64) -> u64 {
    n.next_multiple_of(alignment)
}

/// Whether every array in `value`, at every depth, holds a single element type.
fn is_homogeneous(value: &Value) -> bool {
    match value {
        Value::Array(items) => {
            let first = items.first().map(Value::type_id);
            items
                .iter()
                .all(|v| Some(v.type_id()) == first && is_homogeneous(v))
        }
        _ => true,
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Writes a value's payload (its type id is written by the caller).
fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            // An empty array's element type is arbitrary; readers ignore it.
            let elem = items.first().map_or(type_id::U8, Value::type_id);
            put_u32(out, elem);
            put_u64(out, items.len() as u64);
            for item in items {
                put_value(out, item);
            }
        }
    }
}
