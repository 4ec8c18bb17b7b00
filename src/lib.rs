//! tolerable: a Kubernetes mutating admission webhook that lets Pods onto the tainted
//! architecture pools (arm64, s390x, …) their images can really run on.
//!
//! - [`registry`]: image → platforms, read from registry manifests (the I/O edge), cached.
//! - [`config`]: `tolerable.toml` + `TOLERABLE_*` environment, validated at start-up.
//! - [`cmd`]: the subcommands (`inspect`), thin over the library.

pub mod cli;
pub mod cmd;
pub mod config;
pub mod registry;
pub mod telemetry;
