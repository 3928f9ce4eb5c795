//! GPT-2's byte ↔ unicode mapping: every byte gets a printable character so that BPE
//! vocabularies can be stored as text. Printable Latin-1 bytes map to themselves; the
//! other 68 bytes map to U+0100.. in byte order (so a space becomes 'Ġ', U+0120).

use std::sync::OnceLock;

struct ByteTables {
    to_char: [char; 256],
    /// Indexed by code point; the mapping only uses code points below 0x144.
    from_char: [i16; 0x144],
}

fn tables() -> &'static ByteTables {
    static TABLES: OnceLock<ByteTables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut to_char = ['\0'; 256];
        let mut from_char = [-1i16; 0x144];
        let printable = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut next = 0x100u32;
        for b in 0..256u32 {
            let cp = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            let c = char::from_u32(cp).expect("mapping stays in the BMP");
            to_char[b as usize] = c;
            from_char[cp as usize] = b as i16;
        }
        ByteTables { to_char, from_char }
    })
}

/// The character standing for `byte` in a byte-level vocabulary.
pub fn byte_to_char(byte: u8) -> char {
    tables().to_char[byte as usize]
}

/// The byte a vocabulary character stands for, if it is one of the 256 mapped characters.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as usize;
    let t = tables();
    if cp < t.from_char.len() && t.from_char[cp] >= 0 {
        Some(t.from_char[cp] as u8)
    } else {
        None
    }
}

/// Appends the byte-level encoding of `bytes` to `out`.
pub fn encode_into(bytes: &[u8], out: &mut String) {
    out.extend(bytes.iter().map(|&b| byte_to_char(b)));
}

/// Appends the raw bytes a vocabulary string stands for to `out`. Characters outside the
/// mapping (never produced by GPT-2 vocabularies) are copied through as UTF-8.
pub fn decode_into(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_a_bijection_with_gpt2_anchors() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(0), 'Ā');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('€'), None);
    }
}
