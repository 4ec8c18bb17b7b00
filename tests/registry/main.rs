//! Image lookups against real registries (Debian's docker-registry on 127.0.0.1 with TLS and auth): credentials of every source, pull secrets, the shared cache (redis-server), reach rules and `inspect`.
//!
//! One test binary for these (each binary links the whole crate: a few binaries build far
//! faster than one per file); each module is one file of tests, named by what it exercises.

#[path = "../common/mod.rs"]
mod common;

mod credential_helpers;
mod credential_providers;
mod inspect_cli;
mod placement;
mod pull_secrets;
mod registry_e2e;
mod registry_reach;
mod shared_cache;
