#![no_main]
//! See `prima_server::fuzzing::manifest`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_server::fuzzing::manifest(data));
