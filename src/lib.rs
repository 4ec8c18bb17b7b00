//! tolerable: a Kubernetes mutating admission webhook that lets Pods onto the tainted
//! architecture pools (arm64, s390x, …) their images can really run on.
//!
//! - [`registry`]: image → platforms, read from registry manifests (the I/O edge), cached.
//! - [`mutate`]: the pure decision core (Pod + image facts + pools + policy → decision → JSON
//!   Patch), the workspace crate `tolerable-core` (crates/core): it owns its input types and
//!   depends on no crate that does I/O, so the compiler keeps it pure (ARCHITECTURE.md).
//! - [`engine`]: one Pod's facts gathered and the core asked, built once for `serve` (the
//!   admission shell and the gate controller), `review` and `audit`.
//! - [`admission`]: the AdmissionReview shell over the engine, for the server and `review`.
//! - [`cluster`]: what is read from the Kubernetes API (image pull secrets).
//! - [`server`]: HTTPS transport, certificate reload, health, metrics.
//! - [`config`]: `tolerable.toml` + `TOLERABLE_*` environment, validated at start-up.
//! - [`cmd`]: the subcommands, thin over the library.

pub mod admission;
pub mod app;
pub(crate) mod audit;
pub mod budget;
pub mod cli;
pub mod cluster;
pub mod cmd;
pub mod config;
pub mod crashes;
pub(crate) mod duration;
pub mod engine;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod gates;
pub(crate) mod kinds;
pub mod metrics;
/// The decision core, named `mutate` in the shell as it was before it became a crate of its own
/// (every `crate::mutate::…` path and `tolerable::mutate::…` in tests and benches still reads).
pub use tolerable_core as mutate;
pub mod registry;
pub mod server;
pub mod taints;
pub(crate) mod telemetry;
pub(crate) mod workload;
mod x509;
