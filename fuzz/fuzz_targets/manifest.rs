//! `cargo +nightly fuzz run manifest`: see `tolerable::fuzzing::manifest` for the invariants checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tolerable::fuzzing::manifest(data));
