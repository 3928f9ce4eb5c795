//! Sending and receiving protocol messages over a link (a transport connection, sealed
//! by [`super::secure`] when the cluster has a key).

use super::protocol::{
    decode, encode_control, Activations, Control, Frame, ProtocolError, SpanTable,
};
use super::secure::Link;
use super::RingError;

pub fn send_frame(conn: &Link, frame: &[u8]) -> Result<(), RingError> {
    conn.send(frame)
}

pub fn send_control(conn: &Link, msg: &Control) -> Result<(), RingError> {
    send_frame(conn, &encode_control(msg))
}

/// The next raw frame, or `None` after `timeout_ms`.
pub fn recv_frame(conn: &Link, timeout_ms: u64) -> Result<Option<Vec<u8>>, RingError> {
    conn.recv(timeout_ms)
}

/// The next control message, or `None` after `timeout_ms`.
pub fn recv_control(conn: &Link, timeout_ms: u64) -> Result<Option<Control>, RingError> {
    let Some(frame) = recv_frame(conn, timeout_ms)? else {
        return Ok(None);
    };
    match decode(&frame) {
        Ok(Frame::Control(msg)) => Ok(Some(msg)),
        Ok(Frame::Activations(..)) => Err(RingError::Unexpected {
            peer: conn.peer().into_string(),
            expected: "a control message",
            got: "activations".into(),
        }),
        Err(source) => Err(RingError::Protocol {
            peer: conn.peer().into_string(),
            source,
        }),
    }
}

/// Names `peer` in a frame's protocol error (a `map_err` argument).
pub fn protocol_error(peer: &str) -> impl Fn(ProtocolError) -> RingError + '_ {
    move |source| RingError::Protocol {
        peer: peer.to_string(),
        source,
    }
}

/// An activation frame's header, spans and payload; a control message or a malformed
/// frame is an error naming `peer`.
pub fn decode_activations<'f>(
    frame: &'f [u8],
    peer: &str,
) -> Result<(Activations, SpanTable<'f>, &'f [u8]), RingError> {
    match decode(frame) {
        Ok(Frame::Activations(header, spans, payload)) => Ok((header, spans, payload)),
        Ok(Frame::Control(c)) => Err(RingError::Unexpected {
            peer: peer.to_string(),
            expected: "activations",
            got: format!("{c:?}"),
        }),
        Err(source) => Err(RingError::Protocol {
            peer: peer.to_string(),
            source,
        }),
    }
}

/// Like [`recv_control`], but a timeout is an error naming what was awaited.
pub fn expect_control(
    conn: &Link,
    timeout_ms: u64,
    what: &'static str,
) -> Result<Control, RingError> {
    recv_control(conn, timeout_ms)?.ok_or_else(|| RingError::Unexpected {
        peer: conn.peer().into_string(),
        expected: what,
        got: format!("nothing within {} s", timeout_ms / 1000),
    })
}
