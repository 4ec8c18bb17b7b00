//! The webhook end to end: the real server `serve` runs, its admissions, limits and abuse, faults, certificate rotation, malformed inputs, revalidation and metrics.
//!
//! One test binary for these (each binary links the whole crate: a few binaries build far
//! faster than one per file); each module is one file of tests, named by what it exercises.

#[path = "../common/mod.rs"]
mod common;

mod abuse;
mod abuse_lookups;
mod body_eviction;
mod faults;
mod logs_on_error;
mod malformed_inputs;
mod monitoring;
mod owner_events;
mod revalidation;
mod tls_rotation;
mod webhook;
