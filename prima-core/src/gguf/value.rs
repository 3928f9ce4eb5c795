//! Metadata values as GGUF types them, with the lenient accessors callers want
//! ("any non-negative integer", "any number").

/// One metadata value. Arrays hold values of one type; nested arrays are allowed.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

/// GGUF value type ids, as written in the file.
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The fewest bytes one value of type `id` occupies in a file, or `None` for an unknown
/// id. Bounds element counts before anything is allocated for them.
pub(crate) fn min_encoded_size(id: u32) -> Option<u64> {
    use type_id::*;
    Some(match id {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 => 8,
        STRING => 8,      // u64 length, possibly zero bytes of text
        ARRAY => 4 + 8,   // element type + count, possibly no elements
        _ => return None, // unknown
    })
}

impl Value {
    /// The short name of this value's GGUF type: "u32", "string", "array", ...
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// The GGUF type id this value is written with.
    pub(crate) fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => type_id::U8,
            Value::I8(_) => type_id::I8,
            Value::U16(_) => type_id::U16,
            Value::I16(_) => type_id::I16,
            Value::U32(_) => type_id::U32,
            Value::I32(_) => type_id::I32,
            Value::U64(_) => type_id::U64,
            Value::I64(_) => type_id::I64,
            Value::F32(_) => type_id::F32,
            Value::F64(_) => type_id::F64,
            Value::Bool(_) => type_id::BOOL,
            Value::String(_) => type_id::STRING,
            Value::Array(_) => type_id::ARRAY,
        }
    }

    /// Any integer type holding a value that fits in an `i128`, which all do.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type holding a value that fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// Floats and integers, converted to the nearest `f32`.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => self.as_i128().map(|v| v as f32),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_accessors_accept_any_width_that_fits() {
        assert_eq!(Value::U8(7).as_u64(), Some(7));
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I32(-1).as_i64(), Some(-1));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::U64(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(Value::F32(1.0).as_u64(), None);
        assert_eq!(Value::Bool(true).as_u64(), None);
    }

    #[test]
    fn float_accessor_accepts_integers() {
        assert_eq!(Value::U32(3).as_f32(), Some(3.0));
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(Value::String("1".into()).as_f32(), None);
    }

    #[test]
    fn every_type_id_has_a_minimum_size() {
        let all = [
            Value::U8(0),
            Value::I8(0),
            Value::U16(0),
            Value::I16(0),
            Value::U32(0),
            Value::I32(0),
            Value::U64(0),
            Value::I64(0),
            Value::F32(0.0),
            Value::F64(0.0),
            Value::Bool(false),
            Value::String(String::new()),
            Value::Array(vec![]),
        ];
        for v in all {
            assert!(min_encoded_size(v.type_id()).is_some(), "{}", v.type_name());
        }
        assert_eq!(min_encoded_size(13), None);
    }
}
