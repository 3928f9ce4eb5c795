#![no_main]
//! See `prima_core::fuzzing::ring_frame`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| prima_core::fuzzing::ring_frame(data));
