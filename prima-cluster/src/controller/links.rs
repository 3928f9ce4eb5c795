//! Each ring hop's link (the paper's t_m^{comm}) from what the head can time itself: its
//! round trip to every node ([`LinkProbe`]). Nodes do not time each other, so the hops
//! between two nodes are estimated with a star model — a household's devices reach each
//! other through one access point, each with a one-way latency ℓ of its own, and a hop
//! a → b takes ℓ_a + ℓ_b. The head's r_m = 2(ℓ_head + ℓ_m) gives every ℓ_m once ℓ_head is
//! fixed; ℓ_head is taken as a quarter of the fastest round trip (the head no slower than
//! the best-placed node). Exact where the model holds (the home lab's links are built
//! this way), an estimate elsewhere; a profiles file's own links are kept as given.
//!
//! Timed links are [`steady`]: two significant digits, round trips of at least
//! [`MIN_RTT_MS`], so that the jitter of a fast link (0.01 ms one run, 0.06 ms the next)
//! does not give the same cluster another plan.

use crate::profile::LinkProfile;
use crate::prp::probe::LinkProbe;

/// The shortest round trip a plan counts with, ms: below it, loopback and a fast LAN are
/// one (the ping's own cost through the node's event loop is of this order).
pub const MIN_RTT_MS: f64 = 0.1;

/// `x` to two significant digits.
pub fn steady(x: f64) -> f64 {
    if !x.is_finite() || x <= 0.0 {
        return x;
    }
    let scale = 10f64.powi(1 - x.log10().floor() as i32);
    (x * scale).round() / scale
}

/// The link each device sends on (to the next in `probes`' ring order; the head first,
/// with no probe of its own): `None` where nothing was measured, or for a ring of one.
pub fn ring_links(probes: &[Option<LinkProbe>]) -> Vec<Option<LinkProfile>> {
    let n = probes.len();
    let nodes: Vec<&LinkProbe> = probes.iter().skip(1).flatten().collect();
    if n < 2 || nodes.len() != n - 1 {
        return vec![None; n];
    }
    let fastest = nodes.iter().map(|p| p.rtt_ms).fold(f64::INFINITY, f64::min);
    let head_ms = fastest / 4.0;
    // ℓ_m and the rate each device sends at (the head's is not its limit: a node's probe
    // went through both).
    let one_way: Vec<f64> = std::iter::once(head_ms)
        .chain(nodes.iter().map(|p| (p.rtt_ms / 2.0 - head_ms).max(0.0)))
        .collect();
    let rate: Vec<f64> = std::iter::once(f64::INFINITY)
        .chain(nodes.iter().map(|p| p.bytes_per_s()))
        .collect();
    (0..n)
        .map(|m| {
            let next = (m + 1) % n;
            Some(LinkProfile {
                rtt_ms: steady((2.0 * (one_way[m] + one_way[next])).max(MIN_RTT_MS)),
                bytes_per_s: steady(rate[m].min(rate[next])),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(rtt_ms: f64) -> Option<LinkProbe> {
        Some(LinkProbe {
            rtt_ms,
            payload_rtt_ms: rtt_ms + 1.0,
            payload_bytes: 8192,
        })
    }

    #[test]
    fn the_home_labs_star_is_recovered_exactly() {
        // d1-d4's one-way latencies 2, 3, 2, 6 ms: the head sees round trips 10, 8, 16.
        let links = ring_links(&[None, probe(10.0), probe(8.0), probe(16.0)]);
        let one_way: Vec<f64> = links.iter().map(|l| l.unwrap().rtt_ms / 2.0).collect();
        assert_eq!(one_way, vec![5.0, 5.0, 8.0, 8.0]);
        // 2·8192 B in 1 ms, to two digits.
        assert_eq!(links[1].unwrap().bytes_per_s, 1.6e7);
    }

    #[test]
    fn jitter_below_the_floor_gives_one_link() {
        let a = ring_links(&[None, probe(0.011), probe(0.02)]);
        let b = ring_links(&[None, probe(0.058), probe(0.031)]);
        let rtt =
            |l: &[Option<LinkProfile>]| l.iter().map(|l| l.unwrap().rtt_ms).collect::<Vec<_>>();
        assert_eq!(rtt(&a), vec![MIN_RTT_MS; 3]);
        assert_eq!(rtt(&a), rtt(&b));
        assert_eq!(steady(3.6149), 3.6);
        assert_eq!(steady(16_384_000.0), 1.6e7);
    }

    #[test]
    fn nothing_is_made_up_without_every_probe() {
        assert_eq!(ring_links(&[None]), vec![None]);
        assert_eq!(ring_links(&[None, probe(4.0), None]), vec![None; 3]);
    }
}
