//! The `prima` command: thin glue over `prima_core`.

mod cli;
mod hub;

fn main() -> std::process::ExitCode {
    cli::main()
}
