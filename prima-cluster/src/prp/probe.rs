//! Timing the head's link to a node before planning: empty pings give the round trip,
//! pings padded to a hidden state's bytes give what one activation hop costs. Halda's
//! t_m^{comm} is built from these (`controller::links`); nothing here plans.

use std::time::Instant;

use super::error::RingError;
use super::link::{expect_control, send_control};
use super::protocol::Control;
use super::secure::Link;

/// Pings of each size; the fastest is kept: a link's time is its floor, and a late packet
/// or a busy peer (a node that just started, a host under load) only adds to it — with
/// the median, one busy moment changed plans from run to run.
const PROBE_ROUNDS: usize = 7;
/// A ping unanswered this long is a link not worth measuring further.
const PROBE_TIMEOUT_MS: u64 = 10_000;

/// The head↔node link as the head measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkProbe {
    /// Round trip of an empty ping, ms.
    pub rtt_ms: f64,
    /// Round trip of a ping carrying `payload_bytes` both ways, ms.
    pub payload_rtt_ms: f64,
    pub payload_bytes: usize,
}

impl LinkProbe {
    /// The link's rate from the two round trips (2·bytes over the extra time), capped at
    /// what the clock can resolve: a loopback link is "as fast as memory".
    pub fn bytes_per_s(&self) -> f64 {
        let extra_s = ((self.payload_rtt_ms - self.rtt_ms) / 1000.0).max(1e-6);
        (2.0 * self.payload_bytes as f64 / extra_s).min(10e9)
    }
}

/// Times `conn` (an open control connection after its hello) with pings, empty and
/// padded to `payload_bytes`.
pub fn probe(conn: &Link, payload_bytes: usize) -> Result<LinkProbe, RingError> {
    let mut seq = 0u64;
    let mut fastest_ms = |pad: &str| -> Result<f64, RingError> {
        let mut times = Vec::with_capacity(PROBE_ROUNDS);
        for _ in 0..PROBE_ROUNDS {
            seq += 1;
            let started = Instant::now();
            send_control(
                conn,
                &Control::Ping {
                    seq,
                    pad: pad.to_string(),
                },
            )?;
            match expect_control(conn, PROBE_TIMEOUT_MS, "a pong")? {
                Control::Pong {
                    seq: s,
                    pad: echoed,
                } if s == seq && echoed.len() == pad.len() => {
                    times.push(started.elapsed().as_secs_f64() * 1e3)
                }
                other => {
                    return Err(RingError::Unexpected {
                        peer: conn.peer().into_string(),
                        expected: "a pong echoing the ping",
                        got: format!("{other:?}"),
                    })
                }
            }
        }
        Ok(times.into_iter().fold(f64::INFINITY, f64::min))
    };
    let rtt_ms = fastest_ms("")?;
    let payload_rtt_ms = fastest_ms(&"x".repeat(payload_bytes))?.max(rtt_ms);
    Ok(LinkProbe {
        rtt_ms,
        payload_rtt_ms,
        payload_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_twice_the_payload_over_the_extra_time() {
        let p = LinkProbe {
            rtt_ms: 4.0,
            payload_rtt_ms: 5.0,
            payload_bytes: 8192,
        };
        assert!((p.bytes_per_s() - 2.0 * 8192.0 / 1e-3).abs() < 1e-3);
        let same = LinkProbe {
            payload_rtt_ms: 4.0,
            ..p
        };
        assert_eq!(same.bytes_per_s(), 10e9);
    }
}
