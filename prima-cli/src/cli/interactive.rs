//! `prima run -i` (and `prima chat -m MODEL`): a conversation in the terminal with a
//! model on this device (or the ring it heads). Each line of stdin is a user message,
//! rendered with the chat template and answered as it streams; the KV cache keeps the
//! conversation, so a turn evaluates only what is new. `/help`, `/reset` and `/bye` are
//! handled here and never reach the model. Ctrl-C stops a reply; Ctrl-D or `/bye` ends.

use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use prima_core::chat::{render_chat, ChatMessage};
use prima_core::generate::{generate, Forward, GenerateOptions, StopReason};
use prima_core::sampler::Sampler;

use super::engine::Engine;
use prima_core::tokenizer::Tokenizer;

/// What the conversation starts with.
pub struct Conversation {
    /// The system message, kept across `/reset`.
    pub system: Option<String>,
    /// A first user message, answered before stdin is read (`-p`).
    pub first: Option<String>,
    /// Tokens per reply at most (the context's room, whichever is less).
    pub max_tokens: usize,
    /// The model file, for messages.
    pub model: std::path::PathBuf,
}

const HELP: &str = "/help   this list\n/reset  forget the conversation (the system message stays)\n/bye    end (also /exit, /quit, Ctrl-D)\nCtrl-C stops a reply; a line is a message.";

/// Chats on `forward` until stdin ends or `/bye`.
pub fn chat<F: Forward>(
    forward: &mut F,
    engine: &Engine,
    sampler: &mut Sampler,
    conversation: &Conversation,
) -> anyhow::Result<()>
where
    anyhow::Error: From<F::Error>,
{
    let tok = &engine.tokenizer;
    let template = chat_template(tok, &conversation.model)?;
    let n_ctx = forward.n_ctx();
    let terminal = std::io::stdin().is_terminal();
    let stop = stop_on_ctrl_c();
    if terminal {
        eprintln!(
            "chat with {} ({n_ctx} tokens of context) — /help lists the commands, /bye ends",
            conversation.model.display()
        );
    }
    let opening: Vec<ChatMessage> = conversation
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.as_str()))
        .collect();
    let mut history = opening.clone();
    // The tokens the KV cache holds, in order.
    let mut cached: Vec<u32> = Vec::new();
    let mut pending = conversation.first.clone();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut stdout = std::io::stdout();
    loop {
        let line = match pending.take() {
            Some(first) => first,
            None => {
                if terminal {
                    write!(stdout, "> ")?;
                    stdout.flush()?;
                }
                match lines.next() {
                    Some(line) => line.context("reading standard input")?,
                    None => break,
                }
            }
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/bye" | "/exit" | "/quit" => break,
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            "/reset" => {
                history.clone_from(&opening);
                eprintln!("(conversation forgotten)");
                continue;
            }
            command if command.starts_with('/') => {
                eprintln!(
                    "unknown command {command}: /help lists them (a message cannot start with /)"
                );
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        let text = render_chat(
            template,
            &history,
            None,
            true,
            tok.bos_text(),
            tok.eos_text(),
        )?;
        let tokens = encode_prompt(tok, &text, true);
        if tokens.len() + 1 >= n_ctx {
            history.pop();
            eprintln!(
                "(the conversation is {} tokens and the context holds {n_ctx}: /reset starts over, or raise --ctx-size)",
                tokens.len()
            );
            continue;
        }
        // What the cache already holds of this prompt is not evaluated again.
        let keep = cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        forward.truncate(keep)?;
        let options = GenerateOptions {
            max_tokens: conversation.max_tokens.min(n_ctx - tokens.len()),
            ignore_eos: false,
        };
        stop.replying.store(true, Ordering::SeqCst);
        stop.stop.store(false, Ordering::SeqCst);
        let mut write_error = None;
        let result = generate(forward, tok, sampler, &tokens[keep..], options, |piece| {
            if stop.stop.load(Ordering::SeqCst) {
                return ControlFlow::Break(());
            }
            match stdout
                .write_all(piece.as_bytes())
                .and_then(|_| stdout.flush())
            {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    write_error = Some(e);
                    ControlFlow::Break(())
                }
            }
        });
        stop.replying.store(false, Ordering::SeqCst);
        let (out, stats) = result?;
        if let Some(e) = write_error {
            return Err(e).context("writing the reply");
        }
        writeln!(stdout)?;
        match stats.stop {
            StopReason::ContextFull => {
                eprintln!("(the context is full: /reset starts over, or raise --ctx-size)")
            }
            StopReason::Cancelled => eprintln!("(stopped)"),
            StopReason::MaxTokens if out.len() == conversation.max_tokens => {
                eprintln!("(cut at -n {} tokens)", conversation.max_tokens)
            }
            _ => {}
        }
        history.push(ChatMessage::new("assistant", tok.decode(&out)));
        cached = tokens;
        cached.extend(&out);
        cached.truncate(forward.n_past());
    }
    Ok(())
}

/// Ctrl-C while a reply streams stops that reply; at the prompt it ends the chat.
struct Stop {
    replying: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

fn stop_on_ctrl_c() -> Stop {
    let stop = Stop {
        replying: Arc::new(AtomicBool::new(false)),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let (replying, flag) = (stop.replying.clone(), stop.stop.clone());
    let _ = ctrlc::set_handler(move || {
        if replying.load(Ordering::SeqCst) {
            flag.store(true, Ordering::SeqCst);
        } else {
            eprintln!();
            std::process::exit(130);
        }
    });
    stop
}

/// The model's chat template (or the one given, or its architecture's built-in one); an
/// error saying how to give one where there is none.
pub(crate) fn chat_template<'t>(
    tok: &'t Tokenizer,
    model: &std::path::Path,
) -> anyhow::Result<&'t str> {
    tok.chat_template().with_context(|| {
        format!(
            "{}: chatting needs a chat template, and the model has none (no \
             tokenizer.chat_template, no built-in one for its architecture): give \
             --chat-template NAME|FILE (built-in: chatml, llama3, gemma)",
            model.display()
        )
    })
}

/// `text` rendered as the conversation's next user turn (after the `system` message).
pub(crate) fn chat_prompt(
    tok: &Tokenizer,
    model: &std::path::Path,
    system: Option<&str>,
    text: &str,
) -> anyhow::Result<String> {
    let template = chat_template(tok, model)?;
    let mut messages: Vec<ChatMessage> = system
        .map(|s| ChatMessage::new("system", s))
        .into_iter()
        .collect();
    messages.push(ChatMessage::new("user", text));
    Ok(render_chat(
        template,
        &messages,
        None,
        true,
        tok.bos_text(),
        tok.eos_text(),
    )?)
}

/// Tokens of a prompt: a rendered chat writes its own BOS text, parsed as the special
/// token, so none is added before it.
pub(crate) fn encode_prompt(tok: &Tokenizer, text: &str, chat: bool) -> Vec<u32> {
    let add_bos = tok.add_bos_default()
        && !(chat && text.starts_with(tok.bos_text()) && !tok.bos_text().is_empty());
    tok.encode(text, add_bos, true)
}
