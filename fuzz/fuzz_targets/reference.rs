//! `cargo +nightly fuzz run reference`: see `tolerable::fuzzing::reference` for the invariants checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tolerable::fuzzing::reference(data));
