#![no_main]
//! See `prima_server::fuzzing::tokenizer`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_server::fuzzing::tokenizer(data));
