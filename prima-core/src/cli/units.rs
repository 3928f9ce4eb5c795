//! Parsing sizes given on the command line.

/// Parses a byte count: a plain number, or one with a K/M/G/T suffix (powers of 1024,
/// optionally written KiB/KB/k…), e.g. `512M`, `1.5G`, `2147483648`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (try 512M, 2G or a byte count)"))?;
    let scale: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "'{text}': unknown size unit '{other}' (use K, M, G or T)"
            ))
        }
    };
    Ok((value * scale as f64).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes(" 2g "), Ok(2 << 30));
        assert!(parse_bytes("12Q")
            .unwrap_err()
            .contains("unknown size unit 'q'"));
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
    }
}
