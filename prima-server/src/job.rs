//! What a generation request is and how it ends: the request, the events it gets back,
//! its completion and its errors, and how a prompt becomes tokens. The lowest layer of the
//! server: every other module reads these types; this one reads none of theirs.

use std::time::Duration;

use thiserror::Error;

use prima_core::chat::{render_chat, ChatError, ChatMessage, TemplateJson};
use prima_core::sampler::SamplerConfig;
use prima_core::tokenizer::Tokenizer;

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A conversation, formatted by the model's chat template with the request's tools
    /// (OpenAI's `tools`, if it has them).
    Chat {
        messages: Vec<ChatMessage>,
        tools: Option<TemplateJson>,
    },
    /// Raw text, tokenized as it is (special-token text is parsed).
    Text(String),
}

/// One generation, as the worker understands it (the HTTP layer has already checked it).
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt: Prompt,
    /// Tokens to generate at most; `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    /// Generation ends before the first of these strings; none of it is returned.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Why a generation ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End of generation or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// Cancelled by `POST /v1/cancel` (a client that went away reads nothing).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// The end of a successful generation.
#[derive(Debug, Clone)]
pub struct Completion {
    pub usage: Usage,
    pub finish_reason: FinishReason,
    /// Prompt tokens taken from the previous request's cache instead of evaluated.
    pub cached_prompt_tokens: usize,
    pub time_to_first_token: Duration,
    /// Mean time per output token after the first, in milliseconds.
    pub tpot_ms: f64,
    /// What a draft model did for this request (speculative decoding), if one drafted.
    pub draft: Option<prima_core::speculative::DraftStats>,
}

/// What the worker reports about one job, in this order: `Started`, any number of
/// `Text`, then `Done`; or `Failed` at any point.
#[derive(Debug)]
pub enum Event {
    /// The prompt fits; evaluation begins.
    Started {
        prompt_tokens: usize,
    },
    /// The next piece of generated text.
    Text(String),
    Done(Completion),
    Failed(WorkerError),
}

#[derive(Debug, Error)]
pub enum WorkerError {
    #[error(
        "the prompt has {prompt_tokens} tokens but the context holds {n_ctx} \
         (at least one more position is needed to generate)"
    )]
    PromptTooLong { prompt_tokens: usize, n_ctx: usize },
    #[error("the prompt is empty after tokenization")]
    EmptyPrompt,
    #[error(
        "the model has no chat template (tokenizer.chat_template); \
         use /v1/completions with a formatted prompt"
    )]
    NoChatTemplate,
    /// The template refused the messages (e.g. roles in an order it does not allow).
    #[error(transparent)]
    Template(#[from] ChatError),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("generation failed: {0}")]
    Model(String),
}

impl WorkerError {
    /// Caused by the request (HTTP 4xx) rather than by the server.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            WorkerError::PromptTooLong { .. }
                | WorkerError::EmptyPrompt
                | WorkerError::NoChatTemplate
                | WorkerError::Template(ChatError::Render(_))
        )
    }

    /// OpenAI's `code` for this error, where it has one.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            WorkerError::PromptTooLong { .. } => Some("context_length_exceeded"),
            _ => None,
        }
    }
}

pub(crate) fn tokenize(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>, WorkerError> {
    let ids = match prompt {
        Prompt::Chat { messages, tools } => {
            let template = tokenizer
                .chat_template()
                .ok_or(WorkerError::NoChatTemplate)?;
            let bos = tokenizer.bos_text();
            let text = render_chat(
                template,
                messages,
                tools.as_ref(),
                true,
                bos,
                tokenizer.eos_text(),
            )?;
            // A chat template writes its own BOS text; it is parsed as the special token.
            let writes_bos = !bos.is_empty() && text.starts_with(bos);
            let add_bos = tokenizer.add_bos_default() && !writes_bos;
            tokenizer.encode(&text, add_bos, true)
        }
        Prompt::Text(text) => tokenizer.encode(text, tokenizer.add_bos_default(), true),
    };
    if ids.is_empty() {
        return Err(WorkerError::EmptyPrompt);
    }
    Ok(ids)
}

pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
