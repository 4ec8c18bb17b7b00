//! `cargo +nightly fuzz run token_response`: see `tolerable::fuzzing::token_response` for the invariants checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tolerable::fuzzing::token_response(data));
