//! The offline subcommands as a user runs them: `review` (files, trees, repositories), `audit`, and the exit statuses.
//!
//! One test binary for these (each binary links the whole crate: a few binaries build far
//! faster than one per file); each module is one file of tests, named by what it exercises.

#[path = "../common/mod.rs"]
mod common;

mod audit;
mod check;
mod crashes;
mod doc_samples;
mod exit_statuses;
mod review_repos;
mod review_workloads;
mod serve_review_cli;
