//! The `prima` command: thin glue over `prima_core`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
