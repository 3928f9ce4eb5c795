//! The striped layer-to-device assignment of the paper.
//!
//! Device m takes a window of w_m consecutive layers (n_m ≤ w_m of them on its GPU), in
//! ring order, round after round, until all L layers are placed. With W = Σ w_m there are
//! ⌊L/W⌋ full rounds; the remainder R = L mod W is handed out in one last, partial round in
//! ring order. Per device this gives exactly the paper's
//! l_m = ⌊L/W⌋·w_m + min(w_m, max(0, R − Σ_{j<m} min(w_j, R))), and the same for l_m^gpu
//! with n_m in place of w_m (a window's GPU layers are its first ones).

use std::ops::Range;

/// One device's share of one round: `layers` run there, the first `gpu_layers` of them on
/// its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerWindow {
    /// Position of the device in the ring (0 = head).
    pub device: usize,
    /// Round of the token step, from 0.
    pub round: usize,
    pub layers: Range<usize>,
    pub gpu_layers: usize,
}

/// The layers a device runs on its GPU: the first `n[i]` of each window `windows[i]` (a
/// missing `n[i]` is 0, an `n[i]` over its window's length takes the whole window).
pub fn gpu_layers_of<'a>(
    windows: impl IntoIterator<Item = &'a Range<usize>>,
    n: impl Fn(usize) -> usize,
) -> Vec<usize> {
    windows
        .into_iter()
        .enumerate()
        .flat_map(|(i, w)| w.start..w.start + n(i).min(w.len()))
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("no devices: the window sizes w are empty")]
    NoDevices,
    #[error("w and n have different lengths ({w} and {n})")]
    LengthMismatch { w: usize, n: usize },
    #[error("all window sizes are zero, so no layer can be placed")]
    NothingPlaced,
    #[error("device {device}: n = {n} GPU layers exceeds its window w = {w}")]
    GpuExceedsWindow { device: usize, n: usize, w: usize },
}

fn check(w: &[usize], n: &[usize]) -> Result<usize, WindowError> {
    if w.is_empty() {
        return Err(WindowError::NoDevices);
    }
    if w.len() != n.len() {
        return Err(WindowError::LengthMismatch {
            w: w.len(),
            n: n.len(),
        });
    }
    if let Some(device) = (0..w.len()).find(|&m| n[m] > w[m]) {
        return Err(WindowError::GpuExceedsWindow {
            device,
            n: n[device],
            w: w[device],
        });
    }
    match w.iter().sum() {
        0 => Err(WindowError::NothingPlaced),
        total => Ok(total),
    }
}

/// (l_m, l_m^gpu) for every device, by the paper's closed form.
pub fn layer_counts(
    n_layers: usize,
    w: &[usize],
    n: &[usize],
) -> Result<Vec<(usize, usize)>, WindowError> {
    let big_w = check(w, n)?;
    let (full, r) = (n_layers / big_w, n_layers % big_w);
    let mut before = 0; // Σ_{j<m} min(w_j, R)
    let mut counts = Vec::with_capacity(w.len());
    for m in 0..w.len() {
        let left = r.saturating_sub(before);
        counts.push((full * w[m] + w[m].min(left), full * n[m] + n[m].min(left)));
        before += w[m].min(r);
    }
    Ok(counts)
}

/// Every window of every round, in execution order (round by round, ring order within a
/// round), covering layers 0..n_layers exactly once.
pub fn assign_windows(
    n_layers: usize,
    w: &[usize],
    n: &[usize],
) -> Result<Vec<LayerWindow>, WindowError> {
    check(w, n)?;
    let mut windows = Vec::new();
    let mut next = 0;
    let mut round = 0;
    while next < n_layers {
        for (device, (&wm, &nm)) in w.iter().zip(n).enumerate() {
            let take = wm.min(n_layers - next);
            if take == 0 {
                continue;
            }
            windows.push(LayerWindow {
                device,
                round,
                layers: next..next + take,
                gpu_layers: nm.min(take),
            });
            next += take;
        }
        round += 1;
    }
    Ok(windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_device(windows: &[LayerWindow], devices: usize) -> Vec<(usize, usize)> {
        let mut counts = vec![(0, 0); devices];
        for win in windows {
            counts[win.device].0 += win.layers.len();
            counts[win.device].1 += win.gpu_layers;
        }
        counts
    }

    #[test]
    fn gpu_layers_are_the_first_of_each_window() {
        let windows = [0..4, 10..12, 20..25];
        assert_eq!(gpu_layers_of(&windows, |_| 0), Vec::<usize>::new());
        assert_eq!(
            gpu_layers_of(&windows, |_| 3),
            [0, 1, 2, 10, 11, 20, 21, 22]
        );
        let n = [1, 0, 9];
        let per = |i: usize| n.get(i).copied().unwrap_or(0);
        assert_eq!(gpu_layers_of(&windows, per), [0, 20, 21, 22, 23, 24]);
    }

    #[test]
    fn the_ring_issue_plans() {
        // k = 1: one window per device.
        let w = assign_windows(30, &[10, 10, 10], &[0, 0, 0]).unwrap();
        assert_eq!(
            w.iter().map(|x| x.layers.clone()).collect::<Vec<_>>(),
            [0..10, 10..20, 20..30]
        );
        // k = 2.
        let w = assign_windows(30, &[5, 5, 5], &[0, 0, 0]).unwrap();
        assert_eq!(w.len(), 6);
        assert_eq!(
            (w[3].device, w[3].round, w[3].layers.clone()),
            (0, 1, 15..20)
        );
        // A remainder: W = 12, R = 6 — device 0 gets 4 more, device 1 gets 2, device 2 none.
        let w = assign_windows(30, &[4, 4, 4], &[0, 0, 0]).unwrap();
        assert_eq!(per_device(&w, 3), [(12, 0), (10, 0), (8, 0)]);
        let last = w.last().unwrap();
        assert_eq!(
            (last.device, last.round, last.layers.clone()),
            (1, 2, 28..30)
        );
    }

    #[test]
    fn windows_match_the_closed_form_and_cover_every_layer_once() {
        for l in 1..=40 {
            for w in [[1, 1, 1], [4, 3, 3], [2, 2, 1], [5, 0, 2], [7, 1, 9]] {
                for n in [[0, 0, 0], [1, 0, 0], [0, 0, 1], [1, 0, 2]] {
                    if n.iter().zip(&w).any(|(n, w)| n > w) {
                        continue;
                    }
                    let windows = assign_windows(l, &w, &n).unwrap();
                    let layers: Vec<usize> =
                        windows.iter().flat_map(|x| x.layers.clone()).collect();
                    assert_eq!(layers, (0..l).collect::<Vec<_>>(), "L={l} w={w:?}");
                    assert_eq!(
                        per_device(&windows, 3),
                        layer_counts(l, &w, &n).unwrap(),
                        "L={l} w={w:?} n={n:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_plans_are_refused() {
        assert_eq!(assign_windows(30, &[], &[]), Err(WindowError::NoDevices));
        assert_eq!(
            assign_windows(30, &[0, 0], &[0, 0]),
            Err(WindowError::NothingPlaced)
        );
        assert_eq!(
            assign_windows(30, &[2, 3], &[0, 4]),
            Err(WindowError::GpuExceedsWindow {
                device: 1,
                n: 4,
                w: 3
            })
        );
        assert_eq!(
            layer_counts(30, &[2, 3], &[0]),
            Err(WindowError::LengthMismatch { w: 2, n: 1 })
        );
    }
}
