use super::*;

fn cfg() -> SamplerConfig {
    SamplerConfig {
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        temperature: 1.0,
        ..Default::default()
    }
}

/// The set of ids a config can ever produce on `logits`, from many draws.
fn support(c: SamplerConfig, logits: &[f32]) -> Vec<u32> {
    let mut s = Sampler::new(c);
    let mut seen = vec![false; logits.len()];
    for _ in 0..2000 {
        seen[s.sample(logits) as usize] = true;
    }
    (0..logits.len() as u32)
        .filter(|&i| seen[i as usize])
        .collect()
}

#[test]
fn greedy_picks_argmax_with_ties_to_lowest_id() {
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..cfg()
    });
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9]), 1);
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 3.0]), 1);
    assert_eq!(s.sample(&[-5.0]), 0);
}

#[test]
fn vector_argmax_picks_what_the_scalar_loop_picks() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let specials = [
        f32::NAN,
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.0,
        -1.0,
    ];
    for len in [1, 2, 15, 16, 17, 33, 100, 1000] {
        for _ in 0..200 {
            let logits: Vec<f32> = (0..len)
                .map(|_| match rng.gen_range(0..4) {
                    0 => specials[rng.gen_range(0..specials.len())],
                    // Few distinct values: many ties.
                    1 => rng.gen_range(-3..3) as f32,
                    _ => rng.gen_range(-10.0..10.0),
                })
                .collect();
            let scalar = argmax(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
            assert_eq!(argmax_logits(&logits), scalar, "{logits:?}");
        }
    }
}

#[test]
fn top_k_one_is_greedy() {
    let logits = [0.5, 0.1, 0.7, 0.7, -2.0];
    let mut s = Sampler::new(SamplerConfig { top_k: 1, ..cfg() });
    for _ in 0..50 {
        assert_eq!(s.sample(&logits), 2);
    }
}

#[test]
fn same_seed_same_sequence_other_seed_differs() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplerConfig { seed, ..cfg() });
        (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
    // reset() restarts the RNG.
    let mut s = Sampler::new(SamplerConfig { seed: 7, ..cfg() });
    let first: Vec<u32> = (0..16).map(|_| s.sample(&logits)).collect();
    s.reset();
    let again: Vec<u32> = (0..16).map(|_| s.sample(&logits)).collect();
    assert_eq!(first, again);
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    // Probabilities 0.5, 0.25, 0.125, 0.125.
    let logits = [0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()];
    assert_eq!(
        support(
            SamplerConfig {
                top_p: 0.5,
                ..cfg()
            },
            &logits
        ),
        [0]
    );
    assert_eq!(
        support(
            SamplerConfig {
                top_p: 0.7,
                ..cfg()
            },
            &logits
        ),
        [0, 1]
    );
    assert_eq!(
        support(
            SamplerConfig {
                top_p: 0.8,
                ..cfg()
            },
            &logits
        ),
        [0, 1, 2]
    );
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_best() {
    // Relative to the best: 1, 0.5, 0.2, 0.05.
    let logits = [0.0, 0.5f32.ln(), 0.2f32.ln(), 0.05f32.ln()];
    assert_eq!(
        support(
            SamplerConfig {
                min_p: 0.3,
                ..cfg()
            },
            &logits
        ),
        [0, 1]
    );
    assert_eq!(
        support(
            SamplerConfig {
                min_p: 0.1,
                ..cfg()
            },
            &logits
        ),
        [0, 1, 2]
    );
}

#[test]
fn top_k_limits_the_support() {
    let logits = [1.0, 4.0, 3.0, 2.0, 0.0];
    assert_eq!(
        support(SamplerConfig { top_k: 2, ..cfg() }, &logits),
        [1, 2]
    );
}

#[test]
fn repeat_penalty_changes_the_argmax() {
    let logits = [2.0, 1.8, -1.0];
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.0,
        repeat_penalty: 1.5,
        ..cfg()
    });
    assert_eq!(s.sample(&logits), 0);
    s.accept(0);
    assert_eq!(s.sample(&logits), 1, "2.0 / 1.5 < 1.8");
    // Only the last repeat_last_n tokens count.
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.0,
        repeat_penalty: 1.5,
        repeat_last_n: 2,
        ..cfg()
    });
    s.accept(0);
    s.accept(2);
    s.accept(2);
    assert_eq!(s.sample(&logits), 0);
}

#[test]
fn presence_and_frequency_penalties_subtract() {
    let logits = [2.0, 1.5];
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.0,
        frequency_penalty: 0.2,
        ..cfg()
    });
    s.accept(0);
    s.accept(0);
    assert_eq!(s.sample(&logits), 0, "2.0 - 0.4 > 1.5");
    s.accept(0);
    assert_eq!(s.sample(&logits), 1, "2.0 - 0.6 < 1.5");
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.0,
        presence_penalty: 0.6,
        ..cfg()
    });
    s.accept(0);
    s.accept(0);
    assert_eq!(s.sample(&logits), 1);
}

#[test]
fn temperature_sampling_follows_the_softmax() {
    let logits = [1.0f32, 0.0, -1.0, 0.5];
    let temperature = 0.7;
    let mut s = Sampler::new(SamplerConfig {
        temperature,
        seed: 42,
        ..cfg()
    });
    let n = 20_000;
    let mut counts = [0usize; 4];
    for _ in 0..n {
        counts[s.sample(&logits) as usize] += 1;
    }
    let z: f32 = logits.iter().map(|l| (l / temperature).exp()).sum();
    for (i, &l) in logits.iter().enumerate() {
        let expected = (l / temperature).exp() / z;
        let got = counts[i] as f32 / n as f32;
        assert!(
            (got - expected).abs() < 0.02,
            "token {i}: {got} vs {expected}"
        );
    }
}
