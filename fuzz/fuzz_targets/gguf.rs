#![no_main]
//! See `prima_server::fuzzing::gguf`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_server::fuzzing::gguf(data));
