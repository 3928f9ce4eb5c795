#![no_main]
//! See `prima_core::fuzzing::tokenizer`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_core::fuzzing::tokenizer(data));
