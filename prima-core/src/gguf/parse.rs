//! Parses and validates the header, metadata and tensor index of a GGUF image.
//!
//! Everything here treats the bytes as hostile: every length is checked against what
//! is left before anything is allocated for it, all arithmetic on stored numbers is
//! checked, and array nesting is capped, so any input ends in a value or an error.

use std::collections::HashMap;
use std::path::Path;

use super::cursor::{Cursor, What};
use super::error::{printable, GgufError};
use super::tensor_info::TensorInfo;
use super::value::{min_encoded_size, type_id, Value};
use super::GgmlType;

/// "GGUF" read as a little-endian u32.
const MAGIC: u32 = 0x4655_4747;
const SUPPORTED_VERSIONS: [u32; 2] = [2, 3];
/// Used when `general.alignment` is absent.
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
pub(crate) const MAX_DIMS: u32 = 4;
/// Real files nest arrays at most one level; the cap keeps recursion bounded on
/// hostile input.
const MAX_ARRAY_DEPTH: usize = 16;
/// Smallest possible key/value: empty key (u64 length), u32 type, one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest possible tensor info: empty name, u32 n_dims = 0, u32 type, u64 offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Everything parsed out of the header and tensor index.
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
    pub(crate) metadata: Vec<(String, Value)>,
    pub(crate) key_index: HashMap<String, usize>,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) tensor_index: HashMap<String, usize>,
}

/// Parses a whole GGUF image; `path` only names the file in errors.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Header, GgufError> {
    let mut cur = Cursor::new(path, bytes);
    let magic = cur.u32(&|| "header magic".into())?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            path: path.to_path_buf(),
            magic,
        });
    }
    let version = cur.u32(&|| "header version".into())?;
    if SUPPORTED_VERSIONS.contains(&version.swap_bytes()) {
        // The magic reads the same either way; only the version gives the order away.
        return Err(GgufError::BigEndian {
            path: path.to_path_buf(),
            version: version.swap_bytes(),
        });
    }
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(GgufError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    let tensor_count_at = cur.pos();
    let tensor_count = cur.u64(&|| "header tensor count".into())?;
    let kv_count_at = cur.pos();
    let kv_count = cur.u64(&|| "header metadata count".into())?;

    let (metadata, key_index) = read_metadata(&mut cur, kv_count, kv_count_at)?;
    let alignment = alignment(path, &metadata, &key_index)?;
    let (mut tensors, tensor_index) = read_tensor_infos(&mut cur, tensor_count, tensor_count_at)?;

    // The data section starts at the next multiple of the alignment. An offset beyond
    // u64 saturates; any tensor then fails the bounds check below.
    let data_offset = cur
        .pos()
        .checked_next_multiple_of(alignment)
        .unwrap_or(u64::MAX);
    let file_size = cur.file_size();
    for t in &mut tensors {
        // `offset` still holds the stored, data-relative offset here.
        let relative = t.offset;
        if relative % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                offset: relative,
                alignment,
            });
        }
        let start = data_offset.checked_add(relative);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_size => t.offset = start,
            _ => {
                let start = data_offset.saturating_add(relative);
                return Err(GgufError::TensorOutOfBounds {
                    path: path.to_path_buf(),
                    tensor: t.name.clone(),
                    start,
                    end: start.saturating_add(t.n_bytes),
                    file_size,
                });
            }
        }
    }

    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        key_index,
        tensors,
        tensor_index,
    })
}

type Metadata = (Vec<(String, Value)>, HashMap<String, usize>);

fn read_metadata(cur: &mut Cursor, count: u64, count_at: u64) -> Result<Metadata, GgufError> {
    let cap = cur.check_count(count, count_at, MIN_KV_BYTES, &|| "metadata count".into())?;
    let mut metadata = Vec::with_capacity(cap);
    let mut index = HashMap::with_capacity(cap);
    for i in 0..count {
        let key = cur.string(&|| format!("metadata key #{i}"))?;
        if index.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                path: cur.path().to_path_buf(),
                key,
            });
        }
        let ty = cur.u32(&|| {
            format!(
                "value type of metadata key #{i} '{key}'",
                key = printable(&key)
            )
        })?;
        let value = read_value(cur, ty, &key, 0)?;
        index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }
    Ok((metadata, index))
}

/// Reads one value of type `ty` belonging to metadata key `key`, `depth` arrays deep.
fn read_value(cur: &mut Cursor, ty: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
    let what: What = &|| format!("value of key '{key}'", key = printable(key));
    Ok(match ty {
        type_id::U8 => Value::U8(cur.u8(what)?),
        type_id::I8 => Value::I8(cur.u8(what)? as i8),
        type_id::U16 => Value::U16(cur.u16(what)?),
        type_id::I16 => Value::I16(cur.u16(what)? as i16),
        type_id::U32 => Value::U32(cur.u32(what)?),
        type_id::I32 => Value::I32(cur.u32(what)? as i32),
        type_id::U64 => Value::U64(cur.u64(what)?),
        type_id::I64 => Value::I64(cur.u64(what)? as i64),
        type_id::F32 => Value::F32(f32::from_bits(cur.u32(what)?)),
        type_id::F64 => Value::F64(f64::from_bits(cur.u64(what)?)),
        // Any non-zero byte is true, as llama.cpp reads it.
        type_id::BOOL => Value::Bool(cur.u8(what)? != 0),
        type_id::STRING => Value::String(cur.string(what)?),
        type_id::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    path: cur.path().to_path_buf(),
                    key: key.to_owned(),
                    max_depth: MAX_ARRAY_DEPTH,
                });
            }
            let elem_ty =
                cur.u32(&|| format!("array element type of key '{key}'", key = printable(key)))?;
            let Some(min_elem_bytes) = min_encoded_size(elem_ty) else {
                return Err(GgufError::UnknownValueType {
                    path: cur.path().to_path_buf(),
                    what: format!("array in key '{key}'", key = printable(key)),
                    type_id: elem_ty,
                });
            };
            let len_what: What = &|| format!("array length of key '{key}'", key = printable(key));
            let count_at = cur.pos();
            let count = cur.u64(len_what)?;
            let cap = cur.check_count(count, count_at, min_elem_bytes, len_what)?;
            let mut items = Vec::with_capacity(cap);
            for _ in 0..count {
                items.push(read_value(cur, elem_ty, key, depth + 1)?);
            }
            Value::Array(items)
        }
        _ => {
            return Err(GgufError::UnknownValueType {
                path: cur.path().to_path_buf(),
                what: format!("key '{key}'", key = printable(key)),
                type_id: ty,
            })
        }
    })
}

/// `general.alignment`, or the default; must be a non-zero power of two.
fn alignment(
    path: &Path,
    metadata: &[(String, Value)],
    index: &HashMap<String, usize>,
) -> Result<u64, GgufError> {
    const KEY: &str = "general.alignment";
    let Some(&i) = index.get(KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let value = &metadata[i].1;
    let alignment = value.as_u64().ok_or_else(|| GgufError::WrongType {
        path: path.to_path_buf(),
        key: KEY.to_owned(),
        found: value.type_name(),
        expected: "a non-negative integer",
    })?;
    if !alignment.is_power_of_two() {
        return Err(GgufError::BadAlignment {
            path: path.to_path_buf(),
            alignment,
        });
    }
    Ok(alignment)
}

type TensorIndex = (Vec<TensorInfo>, HashMap<String, usize>);

/// Reads the tensor infos. Each returned `offset` is still relative to the data
/// section; the caller resolves and bounds-checks it.
fn read_tensor_infos(
    cur: &mut Cursor,
    count: u64,
    count_at: u64,
) -> Result<TensorIndex, GgufError> {
    let cap = cur.check_count(count, count_at, MIN_TENSOR_INFO_BYTES, &|| {
        "tensor count".into()
    })?;
    let mut tensors = Vec::with_capacity(cap);
    let mut index = HashMap::with_capacity(cap);
    for i in 0..count {
        let name = cur.string(&|| format!("tensor info #{i} (name)"))?;
        let field = |f: &str| format!("tensor info #{i} '{}' ({f})", printable(&name));
        let n_dims = cur.u32(&|| field("dimension count"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                path: cur.path().to_path_buf(),
                tensor: name,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(cur.u64(&|| field(&format!("dimension {d}")))?);
        }
        let type_id = cur.u32(&|| field("type"))?;
        let offset = cur.u64(&|| field("offset"))?;

        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnknownTensorType {
                path: cur.path().to_path_buf(),
                tensor: name,
                type_id,
            });
        };
        let n_bytes = tensor_bytes(cur.path(), &name, &dims, ggml_type)?;
        if index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor {
                path: cur.path().to_path_buf(),
                name,
            });
        }
        index.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        });
    }
    Ok((tensors, index))
}

/// Bytes of a tensor of shape `dims`: rows × bytes per row, where a row of `dims[0]`
/// elements must be a whole number of blocks. This is `rows * ty.row_bytes(dims[0])`
/// with every step checked, since the dimensions are untrusted.
pub(crate) fn tensor_bytes(
    path: &Path,
    name: &str,
    dims: &[u64],
    ty: GgmlType,
) -> Result<u64, GgufError> {
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim {
            path: path.to_path_buf(),
            tensor: name.to_owned(),
            dims: dims.to_vec(),
        });
    }
    let overflow = || GgufError::SizeOverflow {
        path: path.to_path_buf(),
        tensor: name.to_owned(),
        dims: dims.to_vec(),
    };
    // The element count must fit, so the row count (a factor of it) fits too.
    let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    n_elements.ok_or_else(overflow)?;
    let cols = dims.first().copied().unwrap_or(1);
    let rows: u64 = dims.iter().skip(1).product();
    let block_elems = ty.block_elems() as u64;
    if cols % block_elems != 0 {
        return Err(GgufError::RowNotBlockMultiple {
            path: path.to_path_buf(),
            tensor: name.to_owned(),
            ggml_type: ty,
            cols,
            block_elems,
        });
    }
    (cols / block_elems)
        .checked_mul(ty.block_bytes() as u64)
        .and_then(|row_bytes| row_bytes.checked_mul(rows))
        .ok_or_else(overflow)
}
