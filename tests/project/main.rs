//! The project itself: the deployment (kustomize, the Helm chart), the container image's build, the docs, the architecture's rules, and that the tests run with loopback only.
//!
//! One test binary for these (each binary links the whole crate: a few binaries build far
//! faster than one per file); each module is one file of tests, named by what it exercises.

#[path = "../common/mod.rs"]
mod common;

mod architecture;
mod deploy;
mod docs;
mod generated;
mod helm;
mod image_build;
mod kustomize;
mod loopback_only;
