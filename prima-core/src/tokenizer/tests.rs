//! Unit tests on a small hand-made vocabulary; the real-model comparison with llama.cpp
//! is in `prima-core/tests/tokenizer_fixtures.rs`.

use super::*;

/// 256 byte tokens, a few merges, and ChatML-style control tokens.
fn toy() -> Tokenizer {
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut token_types = vec![3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(byte_level::byte_to_char(b).to_string());
        token_types.push(1);
    }
    let merges = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "r l", "Ġwo rl", "Ġworl d",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        token_types.push(1);
    }
    tokens.push("<tool>".into());
    token_types.push(4);
    tokens.push("<start_of_image>".into());
    token_types.push(4);
    Tokenizer::from_parts(TokenizerParts {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        token_types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        bos: Some(0),
        eos: Some(0),
        chat_template: Some("{{ x }}".into()),
        ..Default::default()
    })
    .unwrap()
}

fn id(t: &Tokenizer, text: &str) -> u32 {
    t.ids[text]
}

#[test]
fn merges_apply_by_rank() {
    let t = toy();
    let ids = t.encode("hello world", false, true);
    assert_eq!(ids, [id(&t, "hello"), id(&t, "Ġworld")]);
    assert_eq!(t.decode(&ids), "hello world");
}

#[test]
fn unmerged_bytes_are_byte_tokens() {
    let t = toy();
    let ids = t.encode("hé", false, true);
    let e_acute = "é".as_bytes();
    assert_eq!(
        ids,
        [
            id(&t, "h"),
            id(&t, &byte_level::byte_to_char(e_acute[0]).to_string()),
            id(&t, &byte_level::byte_to_char(e_acute[1]).to_string())
        ]
    );
    assert_eq!(t.decode(&ids), "hé");
}

#[test]
fn special_tokens_are_parsed_only_when_asked() {
    let t = toy();
    let ids = t.encode("<|im_start|>hello<|im_end|>", false, true);
    assert_eq!(ids, [1, id(&t, "hello"), 2]);
    let plain = t.encode("<|im_start|>hello<|im_end|>", false, false);
    assert!(plain.len() > 3 && !plain.contains(&1) && !plain.contains(&2));
    assert_eq!(t.decode(&plain), "<|im_start|>hello<|im_end|>");
    // Control tokens render as nothing unless asked for.
    assert_eq!(t.decode(&ids), "hello");
    assert_eq!(t.decode_with(&ids, true), "<|im_start|>hello<|im_end|>");
    // User-defined tokens are cut out even without parse_special, and render as text.
    let tool = t.encode("a<tool>b", false, false);
    assert_eq!(tool, [id(&t, "a"), id(&t, "<tool>"), id(&t, "b")]);
    assert_eq!(t.decode(&tool), "a<tool>b");
    // A media marker (Gemma 3's `<start_of_image>`, user-defined in its file) is no
    // text: hidden like a control token.
    let image = t.encode("a<start_of_image>b", false, false);
    assert_eq!(image[1], id(&t, "<start_of_image>"));
    assert_eq!(t.decode(&image), "ab");
    assert_eq!(t.decode_with(&image, true), "a<start_of_image>b");
}

#[test]
fn bos_and_end_of_generation() {
    let t = toy();
    assert_eq!(t.encode("he", true, true), [0, id(&t, "he")]);
    assert!(!t.add_bos_default());
    assert!(t.is_end_of_generation(0));
    assert!(t.is_end_of_generation(2), "<|im_end|> is an end marker");
    assert!(!t.is_end_of_generation(1));
    assert!(!t.is_end_of_generation(1_000_000));
    assert_eq!(t.bos_text(), "<|endoftext|>");
    assert_eq!(t.eos_text(), "<|endoftext|>");
    assert_eq!(t.chat_template(), Some("{{ x }}"));
    let mut t = t;
    t.set_chat_template("{{ y }}".into());
    assert_eq!(t.chat_template(), Some("{{ y }}"));
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let t = toy();
    let text = "héllo 😀 世界";
    let ids = t.encode(text, false, true);
    let mut dec = t.stream_decoder();
    let mut out = String::new();
    for &i in &ids {
        let piece = dec.push(i);
        assert!(!piece.contains(char::REPLACEMENT_CHARACTER));
        out.push_str(&piece);
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text);
}

#[test]
fn stream_decoder_replaces_invalid_bytes_without_stalling() {
    let t = toy();
    let byte = |b: u8| id(&t, &byte_level::byte_to_char(b).to_string());
    let mut dec = t.stream_decoder();
    assert_eq!(dec.push(byte(0xF0)), "");
    assert_eq!(dec.push(byte(b'a')), "\u{FFFD}a");
    assert_eq!(dec.push(byte(0xE4)), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
}

#[test]
fn errors_name_the_key() {
    let bad = |p: TokenizerParts| Tokenizer::from_parts(p).err().unwrap().to_string();
    let base = TokenizerParts {
        model: "gpt2".into(),
        tokens: vec!["a".into(), "b".into()],
        ..Default::default()
    };
    let msg = bad(TokenizerParts {
        model: "llama".into(),
        ..base.clone()
    });
    assert!(
        msg.contains("tokenizer.ggml.model") && msg.contains("llama"),
        "{msg}"
    );
    let msg = bad(TokenizerParts {
        pre: Some("nope".into()),
        ..base.clone()
    });
    assert!(
        msg.contains("tokenizer.ggml.pre") && msg.contains("nope"),
        "{msg}"
    );
    let msg = bad(TokenizerParts {
        merges: vec!["a b".into(), "abc".into()],
        ..base.clone()
    });
    assert_eq!(msg, "tokenizer.ggml.merges entry 1 'abc' has no space");
    let msg = bad(TokenizerParts {
        eos: Some(7),
        ..base.clone()
    });
    assert!(msg.contains("tokenizer.ggml.eos_token_id = 7"), "{msg}");
    let msg = bad(TokenizerParts {
        token_types: vec![1],
        ..base
    });
    assert!(msg.contains("tokenizer.ggml.token_type"), "{msg}");
}

/// gpt-oss's harmony tokens, typed control as its GGUF types them.
fn harmony() -> Tokenizer {
    let specials = [
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
    ];
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| byte_level::byte_to_char(b).to_string())
        .collect();
    let mut token_types = vec![1; tokens.len()];
    tokens.extend(specials.iter().map(|s| s.to_string()));
    token_types.extend([3; 7]);
    Tokenizer::from_parts(TokenizerParts {
        model: "gpt2".into(),
        pre: Some("gpt-4o".into()),
        tokens,
        token_types,
        eos: Some(256),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn harmony_turn_ends_at_return_and_call_not_end() {
    let t = harmony();
    assert!(t.is_end_of_generation(id(&t, "<|return|>")));
    assert!(t.is_end_of_generation(id(&t, "<|call|>")));
    assert!(!t.is_end_of_generation(id(&t, "<|end|>")));
    assert!(!t.is_end_of_generation(id(&t, "<|start|>")));
}

#[test]
fn harmony_markers_are_text_of_the_reply() {
    let t = harmony();
    let reply = "<|channel|>final<|message|>Hi<|end|>";
    for parse_special in [true, false] {
        let ids = t.encode(reply, false, parse_special);
        assert_eq!(ids[0], id(&t, "<|channel|>"));
        assert_eq!(*ids.last().unwrap(), id(&t, "<|end|>"));
        assert_eq!(t.decode(&ids), reply);
    }
    // <|return|> stays a control token: cut out only when parsing specials, never shown.
    assert_eq!(
        t.encode("<|return|>", false, false).len(),
        "<|return|>".len()
    );
    assert_eq!(t.decode(&[id(&t, "<|return|>")]), "");
}
