#![no_main]
//! See `prima_server::fuzzing::harmony_reply`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_server::fuzzing::harmony_reply(data));
