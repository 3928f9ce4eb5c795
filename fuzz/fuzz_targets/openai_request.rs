#![no_main]
//! See `prima_server::fuzzing::openai_request`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_server::fuzzing::openai_request(data));
