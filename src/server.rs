//! HTTPS transport: TLS (rotation-safe), HTTP/1.1 keep-alive and h2, routing, body limits, gzip,
//! deadlines, graceful shutdown. Everything it decides comes from [`Admission`].

pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::io::Read as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument as _;

use crate::admission::Admission;
use crate::metrics::Metrics;
use crate::registry::Resolver;

use self::tls::CertStore;

/// Largest AdmissionReview accepted (the API server's own request limit is 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 << 20;
/// The API server's default webhook timeout, used when a request does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time kept back from the API server's timeout for deciding, encoding and the network.
pub const MIN_DEADLINE_MARGIN: Duration = Duration::from_millis(300);
/// How long in-flight requests get to finish on shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// A TLS handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What request handlers share.
pub struct AppState {
    pub admission: Admission,
    /// The node watch, when enabled: not ready until it has synced.
    pub nodes: Option<crate::cluster::nodes::NodeWatch>,
    pub metrics: Arc<Metrics>,
    pub metrics_registry: prometheus_client::registry::Registry,
    pub resolver: Arc<Resolver>,
    /// Ready once serving; not ready while shutting down.
    pub ready: AtomicBool,
}

type Body = Full<Bytes>;

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

fn json_error(status: StatusCode, reason: &str) -> Response<Body> {
    let body = serde_json::json!({"error": reason}).to_string();
    respond(status, "application/json", body)
}

/// The budget for image lookups: the API server's `?timeout=` minus a margin (a fifth, at least
/// [`MIN_DEADLINE_MARGIN`]), so the answer arrives before the API server gives up.
pub fn lookup_budget(query: Option<&str>) -> Duration {
    let timeout = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("timeout="))
        .and_then(|value| crate::config::parse_duration("timeout", value).ok())
        .filter(|t| !t.is_zero())
        .unwrap_or(DEFAULT_TIMEOUT);
    let margin = (timeout / 5).max(MIN_DEADLINE_MARGIN);
    timeout
        .saturating_sub(margin)
        .max(Duration::from_millis(50))
}

/// Reads the body within the size limit, un-gzipping it if needed.
async fn read_body(req: Request<Incoming>) -> Result<Bytes, Response<Body>> {
    let too_large = || {
        json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("body larger than {MAX_BODY_BYTES} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let encoding = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let body = Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                too_large()
            } else {
                json_error(
                    StatusCode::BAD_REQUEST,
                    &format!("cannot read the body: {e}"),
                )
            }
        })?
        .to_bytes();
    match encoding.as_deref() {
        None | Some("identity") | Some("") => Ok(body),
        Some("gzip") => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .take(MAX_BODY_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| {
                    json_error(
                        StatusCode::BAD_REQUEST,
                        &format!("body is not valid gzip: {e}"),
                    )
                })?;
            if out.len() > MAX_BODY_BYTES {
                return Err(too_large());
            }
            Ok(out.into())
        }
        Some(other) => Err(json_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!("unsupported Content-Encoding {other:?} (gzip or none)"),
        )),
    }
}

async fn mutate(state: &AppState, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let budget = lookup_budget(req.uri().query());
    let body = match read_body(req).await {
        Ok(body) => body,
        Err(response) => {
            state.metrics.admission("bad_request", started.elapsed());
            return response;
        }
    };
    let span = tracing::info_span!("admission", uid = tracing::field::Empty);
    let result = state
        .admission
        .review(&body, budget)
        .instrument(span.clone())
        .await;
    let _entered = span.enter();
    match result {
        Ok(reviewed) => {
            let summary = reviewed
                .decision
                .as_ref()
                .map_or("", |d| d.summary.as_str());
            tracing::info!(
                outcome = reviewed.outcome,
                allowed = reviewed.out.response.allowed,
                patched = reviewed.out.response.patch.is_some(),
                warnings = reviewed.out.response.warnings.len(),
                elapsed_us = started.elapsed().as_micros() as u64,
                "{summary}"
            );
            state.metrics.admission(reviewed.outcome, started.elapsed());
            respond(StatusCode::OK, "application/json", reviewed.out.to_json())
        }
        Err(e) => {
            tracing::warn!(error = %e, "rejected a request that is not an AdmissionReview");
            state.metrics.admission("bad_request", started.elapsed());
            json_error(StatusCode::BAD_REQUEST, &e.to_string())
        }
    }
}

async fn route(state: Arc<AppState>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let response = match (req.method(), req.uri().path()) {
        (&Method::POST, "/mutate") => mutate(&state, req).await,
        (&Method::GET, "/healthz") => respond(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/readyz") => {
            let nodes_synced = state.nodes.as_ref().is_none_or(|n| n.is_synced());
            if !state.ready.load(Ordering::Relaxed) {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not ready: shutting down\n",
                )
            } else if !nodes_synced {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not ready: node watch not synced\n",
                )
            } else {
                respond(StatusCode::OK, "text/plain", "ok\n")
            }
        }
        (&Method::GET, "/metrics") => {
            state
                .metrics
                .set_cache_entries(state.resolver.cached_entries().await);
            if let Some(pools) = state.nodes.as_ref().and_then(|n| n.pools()) {
                state.metrics.set_architectures(&pools);
            }
            respond(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                crate::metrics::encode(&state.metrics_registry),
            )
        }
        (_, "/mutate" | "/healthz" | "/readyz" | "/metrics") => {
            json_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => json_error(
            StatusCode::NOT_FOUND,
            "not found: the webhook path is /mutate",
        ),
    };
    Ok(response)
}

/// Serves on `listener` until `shutdown` completes, then stops accepting, reports not ready, and
/// gives in-flight requests [`SHUTDOWN_GRACE`] to finish.
pub async fn run(
    listener: TcpListener,
    certs: Arc<CertStore>,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(certs.server_config());
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    let graceful = GracefulShutdown::new();
    state.ready.store(true, Ordering::Relaxed);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let state = state.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req| route(state.clone(), req));
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .into_owned();
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    state.ready.store(false, Ordering::Relaxed);
    drop(listener);
    tracing::info!(
        in_flight = graceful.count(),
        "shutting down: finishing requests in flight"
    );
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(SHUTDOWN_GRACE) => tracing::warn!("shutdown grace period over; closing remaining connections"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_from_the_api_servers_timeout() {
        assert_eq!(lookup_budget(Some("timeout=10s")), Duration::from_secs(8));
        assert_eq!(
            lookup_budget(Some("x=1&timeout=30s")),
            Duration::from_secs(24)
        );
        assert_eq!(
            lookup_budget(Some("timeout=1s")),
            Duration::from_millis(700)
        );
        assert_eq!(lookup_budget(None), Duration::from_secs(8));
        assert_eq!(lookup_budget(Some("timeout=bogus")), Duration::from_secs(8));
        assert_eq!(
            lookup_budget(Some("timeout=100ms")),
            Duration::from_millis(50)
        );
    }
}
