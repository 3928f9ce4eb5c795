//! The prompts each golden generation fixture records, per model family.
//! Real models get text (prose, code, numbers, other languages, a question,
//! a chat turn); tiny random models get explicit token ids, since their
//! vocabulary is only there to let llama.cpp load them.

use crate::catalogue::ModelSpec;

pub enum Prompt {
    /// Tokenized by llama.cpp with add_special=true, parse_special=true.
    Text(&'static str),
    Ids(Vec<u32>),
}

pub struct Case {
    pub name: &'static str,
    pub prompt: Prompt,
}

const SMOLLM2_PROMPTS: &[(&str, &str)] = &[
    ("single-token", "Hello"),
    (
        "prose",
        "The old lighthouse keeper climbed the narrow stairs every evening, and",
    ),
    (
        "code",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    ),
    ("numbers", "1, 2, 3, 5, 8, 13, 21,"),
    (
        "french",
        "La tour Eiffel se trouve à Paris. Elle a été construite en",
    ),
    (
        "german",
        "Der schnelle braune Fuchs springt über den faulen Hund, weil",
    ),
    (
        "question",
        "Question: What is the boiling point of water at sea level?\nAnswer:",
    ),
    (
        "chat",
        "<|im_start|>user\nWhat are the three primary colors?<|im_end|>\n<|im_start|>assistant\n",
    ),
];

/// Six cases (the strided sample of Gemma's 262k vocabulary is ~2.7k entries each).
const GEMMA3_PROMPTS: &[(&str, &str)] = &[
    (
        "prose",
        "The old lighthouse keeper climbed the narrow stairs every evening, and",
    ),
    (
        "code",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    ),
    ("numbers", "1, 2, 3, 5, 8, 13, 21,"),
    (
        "french",
        "La tour Eiffel se trouve à Paris. Elle a été construite en",
    ),
    (
        "question",
        "Question: What is the boiling point of water at sea level?\nAnswer:",
    ),
    (
        "chat",
        "<start_of_turn>user\nWhat are the three primary colors?<end_of_turn>\n<start_of_turn>model\n",
    ),
];

/// Every 97th logit for real vocabularies; the whole vector for the tiny
/// models, whose 269 logits cost a few KiB.
pub fn sample_stride(spec: &ModelSpec) -> u32 {
    if is_tiny(spec) {
        1
    } else {
        97
    }
}

fn is_tiny(spec: &ModelSpec) -> bool {
    spec.tag.starts_with("tiny-")
}

pub fn for_model(spec: &ModelSpec) -> Vec<Case> {
    if is_tiny(spec) {
        return tiny_cases();
    }
    let prompts = if spec.tag.starts_with("gemma-3") {
        GEMMA3_PROMPTS
    } else {
        SMOLLM2_PROMPTS
    };
    prompts
        .iter()
        .map(|&(name, text)| Case {
            name,
            prompt: Prompt::Text(text),
        })
        .collect()
}

/// Token-id prompts of lengths 1, 7 and 40 within the tiny models' 269-token
/// vocabulary (ids 0..=255 are bytes, 256..=265 merges, 266..=268 control).
fn tiny_cases() -> Vec<Case> {
    vec![
        Case {
            name: "ids-1",
            prompt: Prompt::Ids(vec![72]),
        },
        Case {
            name: "ids-7",
            prompt: Prompt::Ids(vec![10, 200, 33, 7, 150, 260, 3]),
        },
        Case {
            name: "ids-40",
            prompt: Prompt::Ids((0..40).map(|i| (i * 37 + 11) % 266).collect()),
        },
    ]
}
