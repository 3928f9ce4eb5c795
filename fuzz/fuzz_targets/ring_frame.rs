#![no_main]
//! See `prima_server::fuzzing::ring_frame`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_server::fuzzing::ring_frame(data));
