//! `/metrics`: the Prometheus exposition, on the webhook port or on `metrics_addr`, with the
//! gauges read at scrape time brought up to date first — the server's own (request load,
//! readiness) and, through [`GaugeRefresh`], the rest of the webhook's.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::routes::{http_response, json_error, Body};
use super::{probes, AppState};

/// Sets the gauges read at scrape time that the server does not own (the lookup cache's size,
/// the node watch's sync time, size and architectures). Built in `app.rs`, which holds the
/// resolver and the node watch; the server only calls it before each scrape.
pub(crate) type GaugeRefresh = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// The Prometheus exposition, with the gauges read at scrape time brought up to date:
/// OpenMetrics when the scraper asks for it (Prometheus does), else the Prometheus text format
/// (curl, `promtool check metrics`).
pub(super) async fn metrics(state: &AppState, req: &Request<Incoming>) -> Response<Body> {
    (state.refresh_gauges)().await;
    let load = &state.load;
    state.metrics.set_request_load(
        load.bodies.used(),
        load.max_requests - load.requests.available_permits(),
    );
    state.metrics.set_ready(probes::readiness(state).is_ok());
    let open_metrics = req
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.contains("application/openmetrics-text"));
    if open_metrics {
        http_response(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            crate::metrics::encode(&state.metrics_registry),
        )
    } else {
        http_response(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::metrics::encode_text_format(&state.metrics_registry),
        )
    }
}

/// Scrapers served at once on the metrics port; more wait for the next accept.
const METRICS_CONNECTIONS: usize = 16;

/// `metrics_addr`: plain HTTP, `GET /metrics` (and `/healthz`) only, so a NetworkPolicy can
/// open it to the monitoring namespace alone while the webhook port stays the API server's.
/// Bounded like the webhook port: a few connections, a header deadline, short keep-alive.
pub(crate) async fn serve_metrics(listener: TcpListener, state: Arc<AppState>) {
    let slots = Arc::new(Semaphore::new(METRICS_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "metrics port: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let state = state.clone();
                async move {
                    Ok::<_, Infallible>(match (req.method(), req.uri().path()) {
                        (&Method::GET, "/metrics") => metrics(&state, &req).await,
                        (&Method::GET, "/healthz") => {
                            http_response(StatusCode::OK, "text/plain", "ok\n")
                        }
                        _ => json_error(
                            StatusCode::NOT_FOUND,
                            "not found: this port serves /metrics",
                        ),
                    })
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .serve_connection(TokioIo::new(tcp), service);
            // A scrape takes milliseconds; nothing may hold a slot for long.
            let _ = tokio::time::timeout(Duration::from_secs(60), connection).await;
        });
    }
}
