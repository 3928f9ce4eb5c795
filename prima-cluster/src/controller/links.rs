//! Each ring hop's link (the paper's t_m^{comm}) from what the head can time itself: its
//! round trip to every node ([`LinkProbe`]). Nodes do not time each other, so the hops
//! between two nodes are estimated with a star model — a household's devices reach each
//! other through one access point, each with a one-way latency ℓ of its own, and a hop
//! a → b takes ℓ_a + ℓ_b. The head's r_m = 2(ℓ_head + ℓ_m) gives every ℓ_m once ℓ_head is
//! fixed; ℓ_head is taken as a quarter of the fastest round trip (the head no slower than
//! the best-placed node). Exact where the model holds (the home lab's links are built
//! this way), an estimate elsewhere; a profiles file's own links are kept as given.

use crate::profile::LinkProfile;
use crate::prp::probe::LinkProbe;

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
                rtt_ms: 2.0 * (one_way[m] + one_way[next]),
                bytes_per_s: rate[m].min(rate[next]),
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
        let rate = links[1].unwrap().bytes_per_s;
        assert!((rate - 2.0 * 8192.0 / 1e-3).abs() < 1e-3);
    }

    #[test]
    fn nothing_is_made_up_without_every_probe() {
        assert_eq!(ring_links(&[None]), vec![None]);
        assert_eq!(ring_links(&[None, probe(4.0), None]), vec![None; 3]);
    }
}
