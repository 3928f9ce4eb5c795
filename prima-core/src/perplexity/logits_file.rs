//! The reference log-probabilities of a KL-divergence comparison, in llama-perplexity's
//! `--kl-divergence-base` format, so a file either tool writes the other reads.
//!
//! Little-endian throughout:
//!
//! ```text
//! "_logits_"                      8 bytes
//! n_ctx    u32                    chunk length in tokens
//! n_vocab  i32
//! n_chunk  i32
//! tokens   i32 × n_chunk·n_ctx    the text's tokens, chunk after chunk (no BOS swapped in)
//! rows     per chunk, n_ctx − 1 − n_ctx/2 rows (the scored positions, in order), each
//!          nv = 2·⌈n_vocab/2⌉ + 4 u16:
//!            scale         f32 (2 u16)   (max − min) / 65535
//!            min_log_prob  f32 (2 u16)   log-probability of the smallest logit kept
//!            q             u16 × n_vocab, padded to even: (logit − min) / scale, rounded
//! ```
//!
//! where max is the row's largest logit and min its smallest, but at least max − 16, so
//! a token's log-probability is `scale · q + min_log_prob` to within scale/2 (≤ 1.2e-4),
//! and anything 16 below the top collapses to the floor.

use std::io::{self, Read, Write};

pub const MAGIC: &[u8; 8] = b"_logits_";

/// How many `u16` one row takes: the two floats, then the padded quantized logits.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// The scored positions per chunk: from n_ctx/2 to the one before the last.
pub fn rows_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

#[derive(Debug, thiserror::Error)]
pub enum LogitsFileError {
    #[error("does not start with \"_logits_\": not a file of log-probabilities")]
    Magic,
    #[error("bad header: {0}")]
    Header(String),
    #[error("ends early, in {what}")]
    Truncated { what: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The file's header and evaluation tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitsHeader {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    pub tokens: Vec<u32>,
}

/// Writes a reference file row by row.
pub struct LogitsWriter<W: Write> {
    out: W,
    n_vocab: usize,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

impl<W: Write> LogitsWriter<W> {
    /// Writes the header and `tokens` (`n_chunk · n_ctx` of them).
    pub fn new(
        mut out: W,
        n_ctx: usize,
        n_vocab: usize,
        tokens: &[u32],
    ) -> io::Result<LogitsWriter<W>> {
        let n_chunk = tokens.len() / n_ctx.max(1);
        let mut head = Vec::with_capacity(20 + 4 * tokens.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(n_ctx as u32).to_le_bytes());
        head.extend_from_slice(&(n_vocab as i32).to_le_bytes());
        head.extend_from_slice(&(n_chunk as i32).to_le_bytes());
        for &t in &tokens[..n_chunk * n_ctx] {
            head.extend_from_slice(&t.to_le_bytes());
        }
        out.write_all(&head)?;
        let nv = row_len(n_vocab);
        Ok(LogitsWriter {
            out,
            n_vocab,
            row: vec![0; nv],
            bytes: Vec::with_capacity(2 * nv),
        })
    }

    /// Quantizes and writes one row of logits; returns −log p(`tok`) under them.
    pub fn write_row(&mut self, logits: &[f32], tok: u32) -> io::Result<f64> {
        let logits = &logits[..self.n_vocab];
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = logits.iter().copied().fold(f32::INFINITY, f32::min);
        // Below max − 16 a probability is under 1e-7 of the top one's: not worth the range.
        let min = min.max(max - 16.0);
        let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let min_log_prob = min - max - log_sum_exp;
        let scale = (max - min) / 65535.0;
        let (head, q) = self.row.split_at_mut(4);
        let words = |f: f32| {
            let b = f.to_le_bytes();
            [
                u16::from_le_bytes([b[0], b[1]]),
                u16::from_le_bytes([b[2], b[3]]),
            ]
        };
        head[..2].copy_from_slice(&words(scale));
        head[2..].copy_from_slice(&words(min_log_prob));
        q.fill(0);
        if scale != 0.0 {
            let inv = 1.0 / scale;
            for (q, &l) in q.iter_mut().zip(logits) {
                if l > min {
                    // Rounds half to even, as the FPU's default mode does; `as u16` keeps
                    // the low 16 bits, as the reference's store does.
                    *q = (inv * (l - min)).round_ties_even() as i32 as u16;
                }
            }
        }
        self.bytes.clear();
        for w in &self.row {
            self.bytes.extend_from_slice(&w.to_le_bytes());
        }
        self.out.write_all(&self.bytes)?;
        Ok(f64::from(max + log_sum_exp - logits[tok as usize]))
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One stored row: the reference's log-probabilities, quantized.
pub struct BaseRow<'a> {
    scale: f32,
    min_log_prob: f32,
    q: &'a [u16],
}

impl BaseRow<'_> {
    /// log p_base(`i`).
    pub fn log_prob(&self, i: usize) -> f32 {
        self.scale * f32::from(self.q[i]) + self.min_log_prob
    }
}

/// Reads a reference file: the header at once, then row after row.
pub struct LogitsReader<R: Read> {
    input: R,
    header: LogitsHeader,
    row: Vec<u16>,
    bytes: Vec<u8>,
    rows_read: usize,
}

fn read_exact_or<R: Read>(r: &mut R, buf: &mut [u8], what: &str) -> Result<(), LogitsFileError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => LogitsFileError::Truncated { what: what.into() },
        _ => LogitsFileError::Io(e),
    })
}

impl<R: Read> LogitsReader<R> {
    pub fn new(mut input: R) -> Result<LogitsReader<R>, LogitsFileError> {
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .map_err(|_| LogitsFileError::Magic)?;
        if &magic != MAGIC {
            return Err(LogitsFileError::Magic);
        }
        let mut fields = [0u8; 12];
        read_exact_or(&mut input, &mut fields, "the header")?;
        let field = |i: usize| i32::from_le_bytes(fields[4 * i..4 * i + 4].try_into().unwrap());
        let n_ctx = u32::from_le_bytes(fields[..4].try_into().unwrap()) as usize;
        let (n_vocab, n_chunk) = (field(1), field(2));
        if !(4..=1 << 24).contains(&n_ctx) {
            return Err(LogitsFileError::Header(format!(
                "n_ctx {n_ctx} (4 to 2^24 expected)"
            )));
        }
        if !(1..=1 << 24).contains(&n_vocab) {
            return Err(LogitsFileError::Header(format!("n_vocab {n_vocab}")));
        }
        if !(1..=1 << 24).contains(&n_chunk) || n_chunk as usize * n_ctx > 1 << 28 {
            return Err(LogitsFileError::Header(format!(
                "{n_chunk} chunks of {n_ctx} tokens"
            )));
        }
        let (n_vocab, n_chunk) = (n_vocab as usize, n_chunk as usize);
        let mut raw = vec![0u8; 4 * n_chunk * n_ctx];
        read_exact_or(&mut input, &mut raw, "the tokens")?;
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(LogitsFileError::Header(format!(
                "token {t} outside its vocabulary of {n_vocab}"
            )));
        }
        let nv = row_len(n_vocab);
        Ok(LogitsReader {
            input,
            header: LogitsHeader {
                n_ctx,
                n_vocab,
                n_chunk,
                tokens,
            },
            row: vec![0; nv],
            bytes: vec![0; 2 * nv],
            rows_read: 0,
        })
    }

    pub fn header(&self) -> &LogitsHeader {
        &self.header
    }

    /// The next stored row.
    pub fn next_row(&mut self) -> Result<BaseRow<'_>, LogitsFileError> {
        let per_chunk = rows_per_chunk(self.header.n_ctx);
        let what = format!(
            "row {} of chunk {}",
            self.rows_read % per_chunk + 1,
            self.rows_read / per_chunk + 1
        );
        read_exact_or(&mut self.input, &mut self.bytes, &what)?;
        self.rows_read += 1;
        for (w, b) in self.row.iter_mut().zip(self.bytes.chunks_exact(2)) {
            *w = u16::from_le_bytes([b[0], b[1]]);
        }
        let float = |lo: u16, hi: u16| {
            let (l, h) = (lo.to_le_bytes(), hi.to_le_bytes());
            f32::from_le_bytes([l[0], l[1], h[0], h[1]])
        };
        Ok(BaseRow {
            scale: float(self.row[0], self.row[1]),
            min_log_prob: float(self.row[2], self.row[3]),
            q: &self.row[4..4 + self.header.n_vocab],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_half_a_step() {
        let n_ctx = 8;
        let tokens: Vec<u32> = (0..16).map(|i| i % 5).collect();
        let logits = [2.0f32, -1.0, 0.5, -30.0, 1.0];
        let mut w = LogitsWriter::new(Vec::new(), n_ctx, logits.len(), &tokens).unwrap();
        let nll = w.write_row(&logits, 2).unwrap();
        let bytes = w.finish().unwrap();
        // Header, 16 tokens, one row of 2·3 + 4 u16.
        assert_eq!(bytes.len(), 20 + 64 + 2 * row_len(5));
        let mut r = LogitsReader::new(&bytes[..]).unwrap();
        assert_eq!(
            r.header(),
            &LogitsHeader {
                n_ctx,
                n_vocab: 5,
                n_chunk: 2,
                tokens: tokens.clone()
            }
        );
        let row = r.next_row().unwrap();
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        let step = (2.0 - (2.0 - 16.0)) / 65535.0;
        for (i, &l) in logits.iter().enumerate() {
            let expected = (l - z.ln()).max(2.0 - 16.0 - z.ln());
            assert!(
                (row.log_prob(i) - expected).abs() <= step,
                "token {i}: {} vs {expected}",
                row.log_prob(i)
            );
        }
        assert!((nll + f64::from(row.log_prob(2))).abs() < 1e-3);
        assert!(matches!(
            r.next_row(),
            Err(LogitsFileError::Truncated { .. })
        ));
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(matches!(
            LogitsReader::new(&b"_logitz_"[..]),
            Err(LogitsFileError::Magic)
        ));
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&8u32.to_le_bytes());
        header.extend_from_slice(&5i32.to_le_bytes());
        header.extend_from_slice(&(-1i32).to_le_bytes());
        assert!(matches!(
            LogitsReader::new(&header[..]),
            Err(LogitsFileError::Header(_))
        ));
        let mut short = MAGIC.to_vec();
        short.extend_from_slice(&8u32.to_le_bytes());
        short.extend_from_slice(&5i32.to_le_bytes());
        short.extend_from_slice(&1i32.to_le_bytes());
        short.extend_from_slice(&[0; 12]);
        assert!(matches!(
            LogitsReader::new(&short[..]),
            Err(LogitsFileError::Truncated { .. })
        ));
    }
}
