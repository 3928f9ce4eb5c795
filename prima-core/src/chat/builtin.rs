//! Chat templates built in, for model files that carry none (`tokenizer.chat_template`
//! absent) and for `--chat-template NAME`: the turn formats of the architectures Prima
//! runs, written for the same Jinja environment as a file's own template.

/// ChatML (`<|im_start|>role … <|im_end|>`): Qwen 2 and 3, SmolLM2.
const CHATML: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Llama 3 (`<|start_header_id|>role<|end_header_id|> … <|eot_id|>`).
const LLAMA3: &str = "{{ bos_token }}{% for message in messages %}\
{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/// Gemma 2 and 3 (`<start_of_turn>user|model … <end_of_turn>`): no system turn, so a
/// system message opens the first user turn, as Gemma's own template does.
const GEMMA: &str = "{{ bos_token }}\
{% if messages and messages[0]['role'] == 'system' %}\
{% set first = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}\
{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}\
{% for message in turns %}\
{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}\
{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/// Every built-in template, by the name `--chat-template` takes.
pub const BUILTIN_TEMPLATES: &[(&str, &str)] =
    &[("chatml", CHATML), ("llama3", LLAMA3), ("gemma", GEMMA)];

/// The built-in template called `name` (`chatml`, `llama3`, `gemma`).
pub fn builtin_template(name: &str) -> Option<&'static str> {
    BUILTIN_TEMPLATES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
}

/// The built-in template's name for a model of architecture `arch`
/// (`general.architecture`), when a file lacks its own.
pub fn builtin_for_architecture(arch: &str) -> Option<&'static str> {
    match arch {
        "llama" => Some("llama3"),
        "qwen2" | "qwen2moe" | "qwen3" | "qwen3moe" => Some("chatml"),
        "gemma" | "gemma2" | "gemma3" => Some("gemma"),
        _ => None,
    }
}
