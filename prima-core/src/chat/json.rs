//! JSON as chat templates see it. Objects keep their keys in the order the request wrote
//! them (Python's `json` and llama.cpp's `ordered_json` do, and a tool's parameters are
//! listed in that order), and `tojson` writes what Hugging Face's `tojson` writes:
//! Python's `json.dumps` with `ensure_ascii=False`, `", "` and `": "` between items.

use std::fmt;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Serialize, Serializer};

/// A JSON value (a request's `tools`, a tool call's `arguments`) with its objects' key
/// order kept, ready for a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateJson(Value);

impl TemplateJson {
    /// Parses JSON text, keeping the order of object keys.
    pub fn parse(text: &str) -> Result<TemplateJson, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The template's view of the value.
    pub fn value(&self) -> &Value {
        &self.0
    }
}

/// From an already parsed value, whose objects' keys come in serde_json's (sorted) order.
impl From<&serde_json::Value> for TemplateJson {
    fn from(v: &serde_json::Value) -> TemplateJson {
        TemplateJson(Value::from_serialize(v))
    }
}

impl Serialize for TemplateJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for TemplateJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TemplateJson, D::Error> {
        d.deserialize_any(OrderedVisitor).map(TemplateJson)
    }
}

/// Builds a template value straight from the parser, so a map's keys keep their order.
struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(TemplateJson(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::from(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries: Vec<(String, Value)> = Vec::new();
        while let Some((k, TemplateJson(v))) = map.next_entry::<String, TemplateJson>()? {
            // A repeated key keeps its first place and its last value, as in Python.
            match entries.iter_mut().find(|(old, _)| *old == k) {
                Some(entry) => entry.1 = v,
                None => entries.push((k, v)),
            }
        }
        Ok(entries.into_iter().collect())
    }
}

/// The `tojson` filter as Hugging Face defines it: `json.dumps(value, ensure_ascii=False,
/// indent=indent, separators=separators)`; `sort_keys` is refused, as llama.cpp does.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    if sort_keys == Some(true) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson(sort_keys=true) is not supported",
        ));
    }
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (None, Some(s)) => Some(s.to_owned()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be a number or a string",
                ))
            }
        },
    };
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ))
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = Style {
        indent,
        item_sep,
        key_sep,
        ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    // Marked safe: templates write it as it is (there is no autoescaping here anyway).
    Ok(Value::from_safe_string(out))
}

struct Style {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ascii: bool,
}

fn write_json(out: &mut String, v: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let text = v.to_string();
            match text.as_str() {
                "inf" => out.push_str("Infinity"),
                "-inf" => out.push_str("-Infinity"),
                "NaN" | "nan" => out.push_str("NaN"),
                _ => out.push_str(&text),
            }
        }
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default(), style.ascii),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                separate(out, style, depth + 1, i > 0);
                match key.as_str() {
                    Some(k) => write_string(out, k, style.ascii),
                    None => write_string(out, &key.to_string(), style.ascii),
                }
                out.push_str(&style.key_sep);
                write_json(out, &v.get_item(key)?, style, depth + 1)?;
            }
            close(out, style, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separate(out, style, depth + 1, i > 0);
                write_json(out, item, style, depth + 1)?;
            }
            close(out, style, depth);
            out.push(']');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} cannot be written as JSON", v.kind()),
            ))
        }
    }
    Ok(())
}

fn separate(out: &mut String, style: &Style, depth: usize, not_first: bool) {
    if not_first {
        out.push_str(&style.item_sep);
    }
    if let Some(ind) = &style.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
}

fn close(out: &mut String, style: &Style, depth: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
}

/// A JSON string as Python writes it: `"`, `\` and control characters escaped, the rest
/// as it is unless `ascii` (then `\uXXXX`, surrogate pairs above the BMP).
fn write_string(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (!c.is_ascii() || c == '\u{7f}')) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
