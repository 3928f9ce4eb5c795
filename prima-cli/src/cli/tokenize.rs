//! `prima tokenize`: token ids of a text, as llama.cpp's tokenizer would produce them.

use std::path::PathBuf;

use anyhow::Context;
use prima_core::gguf::GgufFile;
use prima_core::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// GGUF model file whose vocabulary to use.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Text to tokenize.
    #[arg(short = 'p', long)]
    prompt: String,
    /// Do not add the BOS token even if the model asks for it.
    #[arg(long)]
    no_bos: bool,
    /// Treat special-token text literally instead of as the special token.
    #[arg(long)]
    no_parse_special: bool,
}

pub fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let gguf = GgufFile::open(&args.model)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("{}: reading the tokenizer", args.model.display()))?;
    let add_bos = !args.no_bos && tokenizer.add_bos_default();
    let ids = tokenizer.encode(&args.prompt, add_bos, !args.no_parse_special);
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
