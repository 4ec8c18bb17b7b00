//! `cargo +nightly fuzz run admission_review`: see `tolerable::fuzzing::admission_review` for the invariants checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tolerable::fuzzing::admission_review(data));
