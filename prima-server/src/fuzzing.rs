//! Entry points for the fuzz targets (`fuzz/`, run by `cargo xtask fuzz`): each one takes
//! arbitrary bytes down the path a real input of its kind takes, and must return, whatever
//! the bytes, without panicking, hanging or allocating without bound. A bad input is an
//! `Err` somewhere inside and nothing more; the functions return nothing.
//!
//! They live here rather than in `fuzz/` so that the fuzz targets are one line each, the
//! crate-private paths (the OpenAI parser, the node's setup check) stay private, and
//! `tests/fuzz_regressions.rs` replays the inputs that once failed through exactly the
//! code the fuzzer ran, in the normal test suite (no nightly needed).
//!
//! [`seeds`] gives each target's built-in seed corpus (`cargo xtask fuzz` adds the real
//! files: manifests, a model's header).

use std::path::Path;
use std::sync::OnceLock;

use crate::harmony::{Reply, ReplyFormat, ReplyReader};
use crate::openai::{parse_request, Api};
use prima_cluster::manifest::LoadedManifest;
use prima_cluster::prp::protocol::{
    decode, encode_activations, encode_control, encode_tokens, read_logit_rows, read_logits,
    read_payload, read_tokens, Activations, Control, Frame, MemoryBaseline, ModelFingerprint,
    NextHop, PassStats, Ready, Role, RoundWindow, Setup, WireType, PROTOCOL_VERSION,
};
use prima_cluster::prp::residency::Residency;
use prima_core::batch::SeqSpan;
use prima_core::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use prima_core::model::Model;
use prima_core::tokenizer::{Tokenizer, TokenizerParts};

/// The fuzz targets, by name (`fuzz/fuzz_targets/<name>.rs`).
pub const TARGETS: &[&str] = &[
    "gguf",
    "manifest",
    "ring_frame",
    "tokenizer",
    "openai_request",
    "harmony_reply",
];

/// Runs target `name` on `data`; false for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "gguf" => gguf(data),
        "manifest" => manifest(data),
        "ring_frame" => ring_frame(data),
        "tokenizer" => tokenizer(data),
        "openai_request" => openai_request(data),
        "harmony_reply" => harmony_reply(data),
        _ => return false,
    }
    true
}

/// A GGUF image, as `prima` opens a model: the header and tensor index, every tensor's
/// bytes, the tokenizer and a short encode, then the model's weights and their views.
pub fn gguf(data: &[u8]) {
    let Ok(g) = GgufFile::from_bytes("fuzz.gguf", data) else {
        return;
    };
    // Bounds were checked at open: these slices must exist (tensor_data panics otherwise).
    for t in g.tensors() {
        let _ = g.tensor_data(t);
    }
    let _ = ModelFingerprint::of(&g);
    if let Ok(tok) = Tokenizer::from_gguf(&g) {
        let ids = tok.encode(
            "Hello, world! <|im_start|>x ▁y 123",
            tok.add_bos_default(),
            true,
        );
        let _ = tok.decode_with(&ids, true);
        // Templates are not rendered: a model's template is trusted code (and may loop long).
    }
    let Ok(model) = Model::from_gguf(g) else {
        return;
    };
    for t in model.weight_tensors() {
        let _ = model.view(t);
    }
    for il in 0..model.hparams().n_layers {
        let _ = model.layer_bytes(il);
    }
    let _ = (model.global_bytes(), model.read_whole_bytes());
}

/// A manifest's text (lossy UTF-8), parsed and checked as `prima apply` loads it.
pub fn manifest(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(loaded) = LoadedManifest::parse(&text, Path::new("/fuzz/prima.toml")) else {
        return;
    };
    let _ = loaded.head_index();
    for d in &loaded.manifest.devices {
        let _ = loaded.model_path(&d.name);
    }
}

/// One frame as a node receives it (`prp::link` then `prp::node`): a control message
/// (a setup is checked against the node's model and its residency planned), or an
/// activation frame whose payload is read into a batch of the size the header claims.
pub fn ring_frame(data: &[u8]) {
    let model = tiny_model();
    let Ok(frame) = decode(data) else {
        return;
    };
    match frame {
        Frame::Control(msg) => {
            // What was accepted can be sent back.
            let _ = decode(&encode_control(&msg));
            if let Control::Setup(mut setup) = msg {
                let fingerprint = ModelFingerprint::of(model.gguf());
                let _ = prima_cluster::prp::node::check_setup(&setup, model, &fingerprint);
                // The fuzzer cannot forge a header hash: check the rest as if it matched.
                setup.model = fingerprint.clone();
                if prima_cluster::prp::node::check_setup(&setup, model, &fingerprint).is_ok() {
                    let _ = Residency::plan(
                        model,
                        &setup.windows,
                        Some(1 << 20),
                        setup.prefetch,
                        setup.release,
                        setup.release_method,
                    );
                }
            }
        }
        Frame::Activations(header, spans, payload) => {
            // The node's session holds at most n_batch rows (`Session::begin_spans`).
            let n = header.n_tokens as usize;
            if n > TINY_N_BATCH {
                return;
            }
            // A frame of token ids, as a head that runs no layer sends them.
            let mut tokens = Vec::new();
            if read_tokens(&header, payload, model.hparams().n_vocab, &mut tokens).is_ok() {
                let mut table = Vec::new();
                spans.read_into(&mut table);
                let mut out = Vec::new();
                encode_tokens(&mut out, &header, &table, &[], &tokens);
            }
            let mut hidden = vec![0.0f32; n * TINY_N_EMBD];
            if let Ok(section) = read_payload(&header, payload, TINY_N_EMBD, &mut hidden) {
                let mut table = Vec::new();
                spans.read_into(&mut table);
                let mut out = Vec::new();
                encode_activations(&mut out, &header, &table, &hidden);
                // The head's reading of an output device's logits.
                let mut rows = Vec::new();
                if read_logit_rows(&header, payload, &mut rows).is_ok() && rows.len() <= n {
                    let mut logits = vec![0.0f32; rows.len() * 8];
                    let _ = read_logits(section, rows.len(), 8, &mut logits);
                }
            }
        }
    }
}

/// Arbitrary text through the three kinds of tokenizer (byte-level BPE with SmolLM2's
/// pre-tokenizer, with gpt-oss's `gpt-4o` one and its harmony markers, SentencePiece), and
/// arbitrary ids back through the streaming detokenizer. The first byte picks the
/// tokenizer and the flags; the rest is the text (lossy UTF-8) and, read as little-endian
/// u16s, the ids.
pub fn tokenizer(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let tok = match (mode & 1, mode & 16) {
        (0, 0) => toy_bpe(),
        (0, _) => toy_o200k(),
        _ => toy_spm(),
    };
    let (add_bos, parse_special) = (mode & 2 != 0, mode & 4 != 0);
    let text = String::from_utf8_lossy(rest);
    let ids = tok.encode(&text, add_bos, parse_special);
    let vocab = tok.vocab_size() as u32;
    assert!(
        ids.iter().all(|&id| id < vocab),
        "encode gave an id outside the vocabulary"
    );
    if !add_bos && !parse_special && !text.contains(prima_core::tokenizer::SPM_SPACE) {
        // Byte tokens cover every byte in both toy vocabularies: nothing may be lost.
        assert_eq!(tok.decode(&ids), text, "decode does not invert encode");
    }
    let ids: Vec<u32> = rest
        .chunks_exact(2)
        .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    let render_special = mode & 8 != 0;
    let mut stream = tok.stream_decoder().render_special(render_special);
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&stream.push(id));
    }
    streamed.push_str(&stream.finish());
    assert_eq!(
        streamed,
        tok.decode_with(&ids, render_special),
        "the streamed text differs from the whole decode"
    );
}

/// An OpenAI request body (the first byte picks chat or completions), parsed and checked
/// as the server does; a chat it accepts is rendered with SmolLM2's template and
/// tokenized, as the worker does.
pub fn openai_request(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let api = if which & 1 == 0 { Api::Chat } else { Api::Text };
    let Ok(parsed) = parse_request(api, body) else {
        return;
    };
    let _ = crate::job::tokenize(toy_bpe(), &parsed.generation.prompt);
}

/// A chat reply's text (lossy UTF-8 after the first byte) read as gpt-oss's harmony
/// channels, whole and in pieces (the first byte sets their sizes, in characters): both
/// must give the same reply, whatever the text.
pub fn harmony_reply(data: &[u8]) {
    let Some((&cuts, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let whole = Reply::read(ReplyFormat::Harmony, &text);
    let mut reader = ReplyReader::new(ReplyFormat::Harmony);
    let mut streamed = Reply::default();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut at = 0;
    for (i, size) in [1, 2, 3, 5, 8, 13, 21, 34]
        .iter()
        .cycle()
        .skip(usize::from(cuts % 8))
        .enumerate()
    {
        if at >= chars.len() {
            break;
        }
        let size = if cuts & (1 << (i % 8)) != 0 { 1 } else { *size };
        let end = chars.get(at + size).map_or(text.len(), |c| c.0);
        reader
            .push(&text[chars[at].0..end])
            .into_iter()
            .for_each(|d| streamed.add(d));
        at += size;
    }
    reader.finish().into_iter().for_each(|d| streamed.add(d));
    assert_eq!(
        streamed, whole,
        "the reply read in pieces differs from the whole"
    );
}

/// Seed inputs for target `name` (empty for an unknown one): valid inputs of each kind
/// that the fuzzer mutates.
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "gguf" => vec![tiny_model_bytes(), tokenizer_gguf_bytes()],
        "manifest" => vec![prima_cluster::manifest::DEFAULT_MANIFEST.as_bytes().to_vec()],
        "ring_frame" => ring_seeds(),
        "tokenizer" => [
            &b"\x00Hello world! h\xc3\xa9llo <|im_start|>user\n<tool>"[..],
            b"\x05 Hello   world\xe2\x96\x81 \xf0\x9f\x98\x80 123",
            b"\x0c\x03\x00\x01\x00\x45\x01\xff\xff\x80\x00",
            b"\x10<|start|>assistant<|channel|>final<|message|>Hello's 123456 worlds!<|return|>\r\n",
            b"\x1c\x07\x01\x0a\x01\x00\x01 I'm \xe4\xb8\xad\xe6\x96\x87 DON'T\t  x",
        ]
        .iter()
        .map(|s| s.to_vec())
        .collect(),
        "openai_request" => [
            r#"0{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"0{"model":"x","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stop":["\n","<|im_end|>"],"seed":7,"top_p":0.9,"top_k":40}"#,
            r#"1{"prompt":"Once upon a time","max_tokens":16,"stop":"\n","n":1,"ignore_eos":true}"#,
            r#"1{"prompt":["a"],"min_p":0.05,"presence_penalty":1.5,"frequency_penalty":-1,"repeat_penalty":1.1}"#,
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        "harmony_reply" => [
            "\x00<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.",
            "\x05<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
            "\x2a to=functions.f<|channel|>commentary json<|message|>{}<|end|><|start|>assistant<|channel|>analysis<|message|>é <",
            "\x7fPlain text, no markers.",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        _ => Vec::new(),
    }
}

/// Every kind of control message and an activation frame of each wire type.
fn ring_seeds() -> Vec<Vec<u8>> {
    let model = tiny_model();
    let setup = Setup {
        protocol: PROTOCOL_VERSION,
        model: ModelFingerprint::of(model.gguf()),
        device: 1,
        n_devices: 2,
        rounds: 2,
        windows: vec![
            RoundWindow {
                round: 0,
                layers: 0..1,
            },
            RoundWindow {
                round: 1,
                layers: 1..2,
            },
        ],
        gpu_layers: vec![1, 0],
        n_ctx: 64,
        n_batch: TINY_N_BATCH,
        n_slots: 2,
        next: NextHop::Head { port: 9000 },
        prefetch: true,
        release: Default::default(),
        release_method: Default::default(),
        wire: WireType::F16,
        output: None,
    };
    let stats = PassStats {
        seq: 1,
        round: 0,
        n_tokens: 2,
        wait_ms: 0.5,
        compute_ms: 1.5,
        send_ms: 0.1,
        major_faults: 0,
        disk_read_bytes: 0,
        mem_available: 1 << 30,
        ..PassStats::default()
    };
    let controls = [
        Control::Hello {
            protocol: PROTOCOL_VERSION,
            role: Role::Control,
        },
        Control::Hello {
            protocol: PROTOCOL_VERSION,
            role: Role::Data,
        },
        Control::Setup(Box::new(setup)),
        Control::Ready(Ready {
            host: "node-a".into(),
            backend: "cpu".into(),
            layers: 1,
            resident_windows: 1,
            streamed_windows: 0,
            streamed_bytes: 0,
            mem_budget: None,
        }),
        Control::Refused {
            reason: "busy".into(),
        },
        Control::Ping {
            seq: 1,
            pad: String::new(),
        },
        Control::Pong {
            seq: 1,
            pad: "xx".into(),
        },
        Control::ProfileRequest,
        Control::Profile {
            profile: serde_json::json!({"name": "a", "memory": 1}),
        },
        Control::StatsRequest,
        Control::Stats {
            passes: vec![stats],
            memory: MemoryBaseline::default(),
        },
        Control::Shutdown { exit: false },
    ];
    let mut seeds: Vec<Vec<u8>> = controls.iter().map(encode_control).collect();
    let x: Vec<f32> = (0..2 * TINY_N_EMBD)
        .map(|i| i as f32 * 0.125 - 1.0)
        .collect();
    for wire in [WireType::F32, WireType::F16] {
        let header = Activations {
            seq: 3,
            n_tokens: 2,
            round: 1,
            wire,
            logit_rows: 0,
        };
        let spans = [
            SeqSpan {
                slot: 0,
                start: 5,
                len: 1,
            },
            SeqSpan {
                slot: 1,
                start: 0,
                len: 1,
            },
        ];
        let mut frame = Vec::new();
        encode_activations(&mut frame, &header, &spans, &x);
        seeds.push(frame);
        if wire == WireType::F32 {
            // The same batch as the head's tokens.
            let mut frame = Vec::new();
            encode_tokens(&mut frame, &header, &spans, &[1], &[3, 1]);
            seeds.push(frame);
        }
    }
    seeds
}

const TINY_N_EMBD: usize = 8;
const TINY_N_LAYERS: usize = 2;
const TINY_N_BATCH: usize = 4;

/// The node's model for `ring_frame`: a 2-layer Llama with 8-wide embeddings and zero
/// weights, built once.
fn tiny_model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let g = GgufFile::from_bytes("tiny.gguf", &tiny_model_bytes()).expect("tiny model parses");
        Model::from_gguf(g).expect("tiny model loads")
    })
}

fn tiny_model_bytes() -> Vec<u8> {
    let (d, ff, vocab) = (TINY_N_EMBD as u64, 16u64, toy_bpe().vocab_size() as u64);
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()))
        .add("llama.block_count", Value::U32(TINY_N_LAYERS as u32))
        .add("llama.embedding_length", Value::U32(d as u32))
        .add("llama.feed_forward_length", Value::U32(ff as u32))
        .add("llama.attention.head_count", Value::U32(2))
        .add("llama.attention.head_count_kv", Value::U32(1))
        .add("llama.context_length", Value::U32(64))
        .add("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    add_tokenizer_keys(&mut w, toy_bpe_parts());
    let mut tensor = |name: &str, dims: &[u64]| {
        w.add_tensor_unallocated(name, dims, GgmlType::F32)
            .expect("valid tiny tensor");
    };
    tensor("token_embd.weight", &[d, vocab]);
    tensor("output_norm.weight", &[d]);
    let kd = d / 2;
    for il in 0..TINY_N_LAYERS {
        let name = |s: &str| format!("blk.{il}.{s}");
        tensor(&name("attn_norm.weight"), &[d]);
        tensor(&name("attn_q.weight"), &[d, d]);
        tensor(&name("attn_k.weight"), &[d, kd]);
        tensor(&name("attn_v.weight"), &[d, kd]);
        tensor(&name("attn_output.weight"), &[d, d]);
        tensor(&name("ffn_norm.weight"), &[d]);
        tensor(&name("ffn_gate.weight"), &[d, ff]);
        tensor(&name("ffn_up.weight"), &[d, ff]);
        tensor(&name("ffn_down.weight"), &[ff, d]);
    }
    w.to_bytes()
}

/// A tokenizer-only GGUF (no tensors) with the toy SentencePiece vocabulary.
fn tokenizer_gguf_bytes() -> Vec<u8> {
    let mut w = GgufWriter::new();
    add_tokenizer_keys(&mut w, toy_spm_parts());
    w.to_bytes()
}

fn add_tokenizer_keys(w: &mut GgufWriter, p: TokenizerParts) {
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    w.add("tokenizer.ggml.model", Value::String(p.model))
        .add("tokenizer.ggml.tokens", strings(p.tokens))
        .add(
            "tokenizer.ggml.token_type",
            Value::Array(p.token_types.into_iter().map(Value::I32).collect()),
        );
    if let Some(pre) = p.pre {
        w.add("tokenizer.ggml.pre", Value::String(pre));
    }
    if !p.merges.is_empty() {
        w.add("tokenizer.ggml.merges", strings(p.merges));
    }
    if !p.scores.is_empty() {
        w.add(
            "tokenizer.ggml.scores",
            Value::Array(p.scores.into_iter().map(Value::F32).collect()),
        );
    }
    for (key, id) in [("bos", p.bos), ("eos", p.eos)] {
        if let Some(id) = id {
            w.add(&format!("tokenizer.ggml.{key}_token_id"), Value::U32(id));
        }
    }
    if let Some(t) = p.chat_template {
        w.add("tokenizer.chat_template", Value::String(t));
    }
}

/// SmolLM2's chat template (ChatML with a default system prompt).
const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Token types as GGUF stores them.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

/// A byte-level BPE vocabulary in SmolLM2's style: ChatML control tokens, the 256 byte
/// characters, a few merges (with digits split by the `smollm` pre-tokenizer) and a
/// user-defined token.
fn toy_bpe_parts() -> TokenizerParts {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    let mut token_types = vec![CONTROL; 3];
    for b in 0..=255u8 {
        tokens.push(prima_core::tokenizer::byte_to_char(b).to_string());
        token_types.push(NORMAL);
    }
    let merges = [
        "h e",
        "l l",
        "he ll",
        "hell o",
        "Ġ w",
        "Ġw o",
        "r l",
        "Ġwo rl",
        "Ġworl d",
        "Ġ Ġ",
        "ĠĠ ĠĠ",
        "u s",
        "us er",
        "Ċ Ċ",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        token_types.push(NORMAL);
    }
    tokens.push("<tool>".into());
    token_types.push(USER_DEFINED);
    TokenizerParts {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        bos: Some(1),
        eos: Some(2),
        chat_template: Some(CHATML_TEMPLATE.into()),
        ..Default::default()
    }
}

/// A SentencePiece vocabulary in Gemma 3's style: `<pad> <eos> <bos> <unk>`, turn
/// markers, the 256 `<0xXX>` byte tokens and a few scored pieces (no space prefix).
fn toy_spm_parts() -> TokenizerParts {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    let mut token_types = vec![CONTROL, CONTROL, CONTROL, 2];
    let mut scores = vec![0.0; 4];
    for t in ["<start_of_turn>", "<end_of_turn>"] {
        tokens.push(t.into());
        token_types.push(CONTROL);
        scores.push(0.0);
    }
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        token_types.push(BYTE);
        scores.push(0.0);
    }
    let pieces = [
        "▁", "▁▁", "H", "e", "l", "o", "▁w", "r", "d", "he", "ll", "llo", "▁H", "▁He", "▁Hello",
        "▁world", "wor", "1", "2", "3", "é", "😀", "user", "\n",
    ];
    for (i, p) in pieces.iter().enumerate() {
        tokens.push(p.to_string());
        token_types.push(NORMAL);
        scores.push(-(i as f32));
    }
    TokenizerParts {
        model: "llama".into(),
        pre: Some("default".into()),
        tokens,
        token_types,
        scores,
        add_space_prefix: Some(false),
        bos: Some(2),
        eos: Some(1),
        unknown: Some(3),
        padding: Some(0),
        add_bos: Some(true),
        ..Default::default()
    }
}

/// A byte-level BPE vocabulary in gpt-oss's style: the `gpt-4o` pre-tokenizer, the 256
/// byte characters, a few merges and the harmony markers as its GGUF types them (control;
/// the tokenizer makes the message markers user-defined and `<|return|>` the end).
fn toy_o200k_parts() -> TokenizerParts {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| prima_core::tokenizer::byte_to_char(b).to_string())
        .collect();
    let mut token_types = vec![NORMAL; tokens.len()];
    let merges = [
        "H e", "l l", "He ll", "Hell o", "Ġ w", "Ġw o", "' s", "1 2", "12 3",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        token_types.push(NORMAL);
    }
    let specials = [
        "<|endoftext|>",
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
    ];
    let first_special = tokens.len() as u32;
    tokens.extend(specials.iter().map(|s| s.to_string()));
    token_types.extend([CONTROL; 8]);
    TokenizerParts {
        model: "gpt2".into(),
        pre: Some("gpt-4o".into()),
        tokens,
        token_types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        bos: Some(first_special),
        eos: Some(first_special + 1),
        chat_template: Some("{{ '<|start|>assistant<|channel|>final<|message|>' }}".into()),
        ..Default::default()
    }
}

fn toy_o200k() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Tokenizer::from_parts(toy_o200k_parts()).expect("toy o200k vocabulary"))
}

fn toy_bpe() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_parts(toy_bpe_parts()).expect("toy BPE vocabulary"))
}

fn toy_spm() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_parts(toy_spm_parts()).expect("toy SPM vocabulary"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds are valid inputs: each runs through its target (and the model and
    /// tokenizer GGUFs load).
    #[test]
    fn every_seed_runs_through_its_target() {
        for name in TARGETS {
            let seeds = seeds(name);
            assert!(!seeds.is_empty(), "{name} has no seeds");
            for s in seeds {
                assert!(run(name, &s));
            }
        }
        let g = GgufFile::from_bytes("t.gguf", &tokenizer_gguf_bytes()).unwrap();
        Tokenizer::from_gguf(&g).unwrap();
        let _ = tiny_model();
    }

    /// A fixed stream of mutated seeds (bytes flipped, cut, spliced) through the text
    /// targets: a quick stand-in for the fuzzer in the normal test suite.
    #[test]
    fn mutated_seeds_survive_the_text_targets() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for name in ["tokenizer", "harmony_reply"] {
            let seeds = seeds(name);
            for _ in 0..2000 {
                let mut input = seeds[next(seeds.len())].clone();
                for _ in 0..1 + next(4) {
                    match next(4) {
                        0 if !input.is_empty() => {
                            let i = next(input.len());
                            input[i] = next(256) as u8;
                        }
                        1 if !input.is_empty() => input.truncate(next(input.len())),
                        2 => {
                            let other = &seeds[next(seeds.len())];
                            let from = next(other.len());
                            let at = next(input.len() + 1);
                            input.splice(at..at, other[from..].iter().copied());
                        }
                        _ => {
                            let at = next(input.len() + 1);
                            input.insert(at, b"<|>\n "[next(5)]);
                        }
                    }
                }
                input.truncate(512);
                assert!(run(name, &input));
            }
        }
    }
}
