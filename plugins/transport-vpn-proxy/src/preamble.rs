//! What a client tells a relay before the relayed bytes begin, and the relay's answer:
//! one text line each, so a person with `nc` can read them.
//!
//! ```text
//! client → relay:  PRIMA-RELAY 1 10.2.0.3:9000\n
//! relay → client:  OK\n   or   ERR <why>\n
//! ```
//! After `OK` the connection carries the client's bytes to the target and back,
//! unread; after `ERR` the relay closes it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

/// Opens every request; a peer that sends anything else is not a relay client.
pub const MAGIC: &str = "PRIMA-RELAY";
/// The preamble's version; a relay refuses others by name.
pub const VERSION: u32 = 1;
/// The longest line either side reads (a target is a host name and a port).
pub const MAX_LINE: usize = 512;

/// The request line for `target`.
pub fn request(target: &str) -> String {
    format!("{MAGIC} {VERSION} {target}\n")
}

/// The target named by a request line (without its newline), or why the line is not one.
pub fn parse_request(line: &str) -> Result<&str, String> {
    let mut words = line.split(' ');
    if words.next() != Some(MAGIC) {
        return Err("not a Prima relay request (it must start with PRIMA-RELAY)".into());
    }
    match words.next().map(str::parse::<u32>) {
        Some(Ok(VERSION)) => {}
        Some(Ok(v)) => {
            return Err(format!(
                "relay preamble version {v}; this relay speaks {VERSION}"
            ))
        }
        _ => return Err("relay request without a version".into()),
    }
    match (words.next(), words.next()) {
        (Some(target), None) if !target.is_empty() => Ok(target),
        (None, _) | (Some(""), _) => Err("relay request without a target".into()),
        _ => Err("relay request with more than one target".into()),
    }
}

/// The answer to a request: `Ok(())` for `OK`, the relay's reason for `ERR`.
pub fn parse_answer(line: &str) -> Result<(), String> {
    if line == "OK" {
        return Ok(());
    }
    match line.strip_prefix("ERR ") {
        Some(why) => Err(why.to_string()),
        None => Err(format!("not a Prima relay (it answered {line:?})")),
    }
}

/// Writes the relay's answer.
pub fn answer(stream: &TcpStream, result: &Result<(), String>) -> std::io::Result<()> {
    let line = match result {
        Ok(()) => "OK\n".to_string(),
        Err(why) => format!("ERR {}\n", why.replace('\n', " ")),
    };
    let mut w = stream;
    w.write_all(line.as_bytes())
}

/// Reads one line, a byte at a time so that nothing after it is taken from the stream
/// (those bytes belong to the relayed connection). Honours the stream's read timeout.
pub fn read_line(stream: &TcpStream) -> Result<String, String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    let mut r = stream;
    loop {
        match r.read(&mut byte) {
            Ok(0) => return Err("closed before the end of its line".into()),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() >= MAX_LINE => {
                return Err(format!("sent a line longer than {MAX_LINE} bytes"))
            }
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err("sent no complete line in time".into())
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    String::from_utf8(line).map_err(|_| "sent a line that is not UTF-8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips() {
        let line = request("10.2.0.3:9000");
        assert_eq!(parse_request(line.trim_end()), Ok("10.2.0.3:9000"));
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let err = |l: &str| parse_request(l).unwrap_err();
        assert!(err("GET / HTTP/1.1").contains("not a Prima relay request"));
        assert!(err("PRIMA-RELAY 7 a:1").contains("version 7"));
        assert!(err("PRIMA-RELAY x a:1").contains("without a version"));
        assert!(err("PRIMA-RELAY 1").contains("without a target"));
        assert!(err("PRIMA-RELAY 1 a:1 b:2").contains("more than one target"));
    }

    #[test]
    fn answers_parse() {
        assert_eq!(parse_answer("OK"), Ok(()));
        assert_eq!(parse_answer("ERR no"), Err("no".into()));
        assert!(parse_answer("HTTP/1.1 400")
            .unwrap_err()
            .contains("not a Prima relay"));
    }
}
