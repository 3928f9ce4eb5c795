#![no_main]
//! See `prima_core::fuzzing::manifest`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_core::fuzzing::manifest(data));
