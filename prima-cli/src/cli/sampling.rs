//! The sampling flags `prima run` and `prima apply --prompt` share, with one set of
//! defaults: llama.cpp's (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, a random
//! seed, and tokens until the model ends its reply or the context is full), so a command
//! copied from llama.cpp behaves the same here. `--temp 0` is greedy. Each value is
//! checked against the range the server's API accepts, with the same words.

use prima_core::sampler::SamplerConfig;

#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Tokens to generate at most; -1: until the model ends its reply or the context is full.
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true,
          value_parser = parse_n_predict)]
    pub n_predict: i64,
    /// Sampling temperature, 0 to 2; 0 is greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true,
          value_parser = |s: &str| in_range("temp", s, 0.0, 2.0))]
    pub temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P, 0 to 1 (1: all).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true,
          value_parser = |s: &str| in_range("top-p", s, 0.0, 1.0))]
    pub top_p: f32,
    /// Drop tokens less likely than P × the most likely one, 0 to 1 (0: off).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true,
          value_parser = |s: &str| in_range("min-p", s, 0.0, 1.0))]
    pub min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens, 0 to 10 (1: off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true,
          value_parser = |s: &str| in_range("repeat-penalty", s, 0.0, 10.0))]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtract from the logit of every token already seen, -2 to 2 (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true,
          value_parser = |s: &str| in_range("presence-penalty", s, -2.0, 2.0))]
    pub presence_penalty: f32,
    /// RNG seed (default: random, printed at the end); the same seed gives the same text.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The seed given, else one from the clock.
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        })
    }

    pub fn config(&self, seed: u64) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: 0.0,
            seed,
        }
    }

    /// `-n` as a token count (-1: no limit but the context).
    pub fn max_tokens(&self) -> usize {
        usize::try_from(self.n_predict).unwrap_or(usize::MAX)
    }
}

/// A number in `min..=max`, in the words the server's API uses for the same field.
fn in_range(flag: &str, s: &str, min: f32, max: f32) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(x) if (min..=max).contains(&x) => Ok(x),
        _ => Err(format!(
            "--{flag} must be a number from {min} to {max}, not {s}"
        )),
    }
}

fn parse_n_predict(s: &str) -> Result<i64, String> {
    match s.parse::<i64>() {
        Ok(n) if n >= -1 => Ok(n),
        _ => Err(format!(
            "-n must be a number of tokens, or -1 for no limit but the context, not {s}"
        )),
    }
}
