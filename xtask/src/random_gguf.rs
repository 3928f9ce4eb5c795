//! What the generated random-weight models share: a seeded per-tensor random stream and a
//! stub byte-level tokenizer, so that a model of any shape loads in Prima and llama.cpp.
//! Below the model writers (`bench_models/random_llama.rs`, `random_moe.rs`).

use prima_core::gguf::{GgufWriter, Value};
use sha2::{Digest, Sha256};

/// The 1B model's tokenizer, widened to `n_vocab`: byte-level BPE over GPT-2's 256 byte
/// tokens, one real merge (llama.cpp refuses a BPE vocabulary without merges), filler
/// tokens, and `<|endoftext|>` last as BOS and EOS. Any text tokenizes; the filler ids
/// only make the embedding and output head as large as a real vocabulary's.
pub(crate) fn add_stub_tokenizer(w: &mut GgufWriter, n_vocab: u64) {
    let n_vocab = usize::try_from(n_vocab).expect("vocabulary fits usize");
    let mut tokens: Vec<String> = byte_to_unicode().into_iter().map(String::from).collect();
    tokens.push("\u{0120}t".into());
    let n_filler = n_vocab - tokens.len() - 1;
    tokens.extend((0..n_filler).map(|i| format!("<filler_{i}>")));
    tokens.push("<|endoftext|>".into());
    // llama.cpp's token types: 1 = normal, 3 = control.
    let mut types = vec![Value::I32(1); n_vocab];
    types[n_vocab - 1] = Value::I32(3);
    let eos = Value::U32(u32::try_from(n_vocab - 1).expect("vocabulary fits u32"));
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()))
        .add("tokenizer.ggml.pre", Value::String("llama-bpe".into()))
        .add(
            "tokenizer.ggml.tokens",
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        )
        .add("tokenizer.ggml.token_type", Value::Array(types))
        .add(
            "tokenizer.ggml.merges",
            Value::Array(vec![Value::String("\u{0120} t".into())]),
        )
        .add("tokenizer.ggml.bos_token_id", eos.clone())
        .add("tokenizer.ggml.eos_token_id", eos)
        .add("tokenizer.ggml.add_bos_token", Value::Bool(false));
}

/// GPT-2's printable stand-ins for the 256 byte values, in byte order.
pub(crate) fn byte_to_unicode() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("Latin-1 is valid")
            } else {
                extra += 1;
                char::from_u32(255 + extra).expect("Latin Extended-A is valid")
            }
        })
        .collect()
}

/// SplitMix64 (Steele, Lea & Flood 2014): tiny, fast and well mixed; one stream per tensor.
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn for_tensor(seed: u64, name: &str) -> SplitMix64 {
        let digest = Sha256::new()
            .chain_update(seed.to_le_bytes())
            .chain_update(name.as_bytes())
            .finalize();
        SplitMix64(u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")))
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fills `out` with the stream's next bytes (little-endian u64s; a final partial
    /// draw is truncated).
    pub(crate) fn fill(&mut self, out: &mut [u8]) {
        let mut words = out.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = words.into_remainder();
        if !rest.is_empty() {
            let n = rest.len();
            rest.copy_from_slice(&self.next().to_le_bytes()[..n]);
        }
    }
}
