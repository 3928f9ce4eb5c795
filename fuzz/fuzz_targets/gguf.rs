#![no_main]
//! See `prima_core::fuzzing::gguf`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_core::fuzzing::gguf(data));
