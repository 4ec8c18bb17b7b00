//! The kubelet's probes: `/healthz` (alive) and `/readyz` (serving, and whatever else `app.rs`
//! says readiness waits for).

use std::sync::atomic::Ordering;

use http::{Response, StatusCode};

use super::routes::{http_response, Body};
use super::AppState;

/// What else readiness waits for, besides the server serving: `Err` with the line `/readyz`
/// answers (the node watch not synced yet). Built in `app.rs`, which knows the node watch;
/// the server only asks.
pub(crate) type ReadinessCheck = Box<dyn Fn() -> Result<(), &'static str> + Send + Sync>;

/// Whether the webhook is ready (serving, and ready by `state.readiness`); else why not.
pub(super) fn readiness(state: &AppState) -> Result<(), &'static str> {
    if !state.ready.load(Ordering::Relaxed) {
        Err("not ready: shutting down\n")
    } else {
        (state.readiness)()
    }
}

/// `/healthz` (alive) and `/readyz` (serving and ready).
pub(super) fn probe(state: &AppState, path: &str) -> Response<Body> {
    if path == "/healthz" {
        return http_response(StatusCode::OK, "text/plain", "ok\n");
    }
    match readiness(state) {
        Ok(()) => http_response(StatusCode::OK, "text/plain", "ok\n"),
        Err(why) => http_response(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why),
    }
}
