//! How many micro-batches the ring head keeps in flight at once: measured, not assumed.
//!
//! More micro-batches let more devices compute at the same moment, but each holds fewer
//! rows, and a product's cost per row rises as its rows fall (fewer rows share each
//! weight read; K-quant and float weights run 1–3 rows as one dot product per row). Whether
//! it pays also depends on what the head cannot see: devices with cores of their own (a
//! home cluster) overlap, devices sharing one machine's cores (a loopback ring) barely.
//! So the head measures: for each shape of batch (its entries, its tokens to within a
//! power of two), every count from 1 to the most allowed is tried a few times, then the
//! fastest (median of its last evaluations) is used, and the others are tried again now
//! and then, so that a change (the machine's load, a longer context) is noticed.
//!
//! Not here: cutting a batch into micro-batches, or running them (`head.rs`).

use std::collections::{HashMap, VecDeque};

/// How many micro-batches the head keeps in flight: `--micro-batches` of `prima apply`,
/// `policy.micro_batches` in a manifest, `PRIMA_MICRO_BATCHES` where neither is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatches {
    /// This many (at most one per request of a batch); 1 is one batch at a time.
    Fixed(usize),
    /// As many as the head measures fastest ([`MicroBatchTuner`]).
    Tuned,
}

impl MicroBatches {
    /// `tuned` or a whole number ≥ 1.
    pub fn parse(s: &str) -> Result<MicroBatches, String> {
        let s = s.trim();
        if s == "tuned" {
            return Ok(MicroBatches::Tuned);
        }
        match s.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(MicroBatches::Fixed(n)),
            _ => Err(format!("must be `tuned` or a whole number ≥ 1, not {s:?}")),
        }
    }

    /// As `RingOptions::micro_batches` takes it: `None` to measure.
    pub fn count(self) -> Option<usize> {
        match self {
            MicroBatches::Fixed(n) => Some(n),
            MicroBatches::Tuned => None,
        }
    }
}

impl<'de> serde::Deserialize<'de> for MicroBatches {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MicroBatches, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(i64),
            S(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::N(n) => n.to_string(),
            Raw::S(s) => s,
        };
        MicroBatches::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Evaluations of each count, for a shape, before the fastest is chosen. Few: on a
/// machine whose cores the devices share, every try of a count above 1 is a slow step
/// (`cargo xtask bench-serve --micro-batches 1,2,tuned` measures what trying costs).
const TRIES: usize = 2;
/// Evaluations of a count remembered (the median of these is its time).
const KEPT: usize = 5;
/// Once every count has its tries, one evaluation in this many tries a count next to
/// the fastest (one fewer or one more), in turn.
const EXPLORE_EVERY: u64 = 32;

/// What a batch looks like to the tuner: its entries, and its tokens' power of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Shape {
    entries: usize,
    tokens_log2: u32,
}

impl Shape {
    fn of(entries: usize, tokens: usize) -> Shape {
        Shape {
            entries,
            tokens_log2: tokens.max(1).ilog2(),
        }
    }
}

/// The recent times of each count (index m − 1) for one shape.
#[derive(Debug, Default)]
struct Counts {
    times: Vec<VecDeque<f64>>,
    /// Evaluations chosen so far.
    uses: u64,
    /// The count the last exploration tried.
    explored: usize,
}

impl Counts {
    fn median(&self, m: usize) -> f64 {
        let mut t: Vec<f64> = self.times[m - 1].iter().copied().collect();
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    }
}

/// Chooses how many micro-batches each batch is cut into, from what earlier batches of
/// its shape took.
#[derive(Debug)]
pub struct MicroBatchTuner {
    most: usize,
    shapes: HashMap<Shape, Counts>,
}

impl MicroBatchTuner {
    /// A tuner that uses at most `most` micro-batches (at least 1).
    pub fn new(most: usize) -> MicroBatchTuner {
        MicroBatchTuner {
            most: most.max(1),
            shapes: HashMap::new(),
        }
    }

    /// The count for a batch of `entries` entries holding `tokens` tokens: one that has
    /// not had its tries yet, else now and then another to look again, else the
    /// fastest.
    pub fn choose(&mut self, entries: usize, tokens: usize) -> usize {
        let most = self.most.min(entries);
        if most <= 1 {
            return 1;
        }
        let counts = self.shapes.entry(Shape::of(entries, tokens)).or_default();
        counts.times.resize_with(most, VecDeque::new);
        counts.uses += 1;
        if let Some(i) = counts.times.iter().position(|t| t.len() < TRIES) {
            return i + 1;
        }
        let fastest = (1..=most)
            .min_by(|&a, &b| counts.median(a).total_cmp(&counts.median(b)))
            .unwrap_or(1);
        if counts.uses.is_multiple_of(EXPLORE_EVERY) {
            // One fewer and one more than the fastest, in turn (counts further off are
            // slower still when the nearer ones are).
            let fewer = (fastest > 1).then(|| fastest - 1);
            let more = (fastest < most).then(|| fastest + 1);
            let m = match (fewer, more) {
                (Some(f), Some(m)) => {
                    if counts.explored == f {
                        m
                    } else {
                        f
                    }
                }
                (Some(f), None) => f,
                (None, Some(m)) => m,
                (None, None) => fastest,
            };
            counts.explored = m;
            return m;
        }
        fastest
    }

    /// Records that a batch of `entries` entries and `tokens` tokens, cut into `m`
    /// micro-batches, took `seconds`.
    pub fn record(&mut self, entries: usize, tokens: usize, m: usize, seconds: f64) {
        let Some(counts) = self.shapes.get_mut(&Shape::of(entries, tokens)) else {
            return;
        };
        let Some(times) = counts.times.get_mut(m.wrapping_sub(1)) else {
            return;
        };
        if times.len() == KEPT {
            times.pop_front();
        }
        times.push_back(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `evals` evaluations of one shape whose time for m micro-batches is
    /// `cost(m)`; the counts chosen.
    fn run(
        tuner: &mut MicroBatchTuner,
        entries: usize,
        evals: usize,
        cost: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        (0..evals)
            .map(|_| {
                let m = tuner.choose(entries, entries);
                tuner.record(entries, entries, m, cost(m));
                m
            })
            .collect()
    }

    #[test]
    fn every_count_is_tried_then_the_fastest_is_used() {
        let mut tuner = MicroBatchTuner::new(3);
        let chosen = run(&mut tuner, 4, 200, |m| [0.040, 0.025, 0.030][m - 1]);
        assert_eq!(&chosen[..6], &[1, 1, 2, 2, 3, 3]);
        let after = &chosen[6..];
        let fastest = after.iter().filter(|&&m| m == 2).count();
        assert!(fastest >= after.len() - after.len() / EXPLORE_EVERY as usize - 1);
        // Its neighbours are looked at again now and then.
        assert!(after.contains(&1) && after.contains(&3));
    }

    #[test]
    fn a_count_that_becomes_slow_is_left() {
        let mut tuner = MicroBatchTuner::new(2);
        run(&mut tuner, 2, 20, |m| [0.030, 0.020][m - 1]);
        // Two micro-batches get slower (the machine got busy): after a few of its
        // evaluations, one batch is used.
        let chosen = run(&mut tuner, 2, 20, |m| [0.030, 0.050][m - 1]);
        assert_eq!(&chosen[chosen.len() - 5..], &[1; 5]);
    }

    #[test]
    fn never_more_than_the_entries_or_the_most_allowed() {
        let mut tuner = MicroBatchTuner::new(3);
        assert!(run(&mut tuner, 1, 10, |_| 0.01).iter().all(|&m| m == 1));
        assert!(run(&mut tuner, 2, 30, |_| 0.01).iter().all(|&m| m <= 2));
        let mut one = MicroBatchTuner::new(1);
        assert!(run(&mut one, 8, 30, |_| 0.01).iter().all(|&m| m == 1));
        // Shapes are kept apart: 8 entries of 1 token, and of 200 tokens.
        let mut tuner = MicroBatchTuner::new(2);
        run(&mut tuner, 8, 20, |m| [0.01, 0.02][m - 1]);
        assert_eq!(tuner.choose(8, 200), 1);
        tuner.record(8, 200, 1, 0.5);
        assert_eq!(tuner.choose(8, 8), 1);
    }
}
