//! HTTPS transport: TLS (rotation-safe), HTTP/1.1 keep-alive and h2, routing, body limits, gzip,
//! deadlines, graceful shutdown, and the limits that keep abusive clients from exhausting memory
//! or file descriptors. Everything it decides comes from [`Admission`].

pub mod body;
pub mod connection;
pub(crate) mod slots;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::Instrument as _;

use crate::admission::Admission;
use crate::metrics::Metrics;
use crate::mutate::Outcome;
use crate::registry::Resolver;

use self::body::{Budget, Reservation};
use self::connection::{ConnectionState, Tracked};
use self::slots::{Slot, Slots};
use self::tls::CertStore;

/// Largest AdmissionReview accepted (the API server's own request limit is 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 << 20;
/// How long in-flight requests get to finish on shutdown.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Connections accepted past `max_connections` (when no pending connection's slot can be taken
/// back) that may ask `/healthz` and `/readyz`, so the kubelet's probes get through a flood
/// (each lives at most [`PROBE_TIMEOUT`] idle); any other request on one takes an idle
/// connection's slot, or gets a 503.
pub const PROBE_CONNECTIONS: usize = 8;
/// Handshake, request and idle timeout of a connection beyond `max_connections`.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// File descriptors kept for everything but client connections (registries, the API server,
/// certificate files, the listener).
pub(crate) const RESERVED_FDS: u64 = 128;
/// Concurrent HTTP/2 streams per connection; each stream's body draws on the connection's
/// memory budget anyway.
const H2_MAX_CONCURRENT_STREAMS: u32 = 100;
/// HTTP/2 PINGs notice a peer that vanished while a request is in progress.
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest HTTP/1.1 read buffer (a request head must fit), instead of hyper's ~400 KiB, so a
/// thousand connections sending endless headers hold tens of MiB, not hundreds.
const H1_MAX_BUF_SIZE: usize = 64 << 10;

/// Connection and request limits: settings, defined with the config's `[server]` section.
pub use crate::config::ServerLimits;

/// What request handlers share.
pub struct AppState {
    pub admission: Admission,
    /// The node watch, when enabled: not ready until it has synced.
    pub nodes: Option<crate::cluster::nodes::NodeWatch>,
    pub(crate) metrics: Arc<Metrics>,
    pub metrics_registry: prometheus_client::registry::Registry,
    pub(crate) resolver: Arc<Resolver>,
    /// Ready once serving; not ready while shutting down.
    pub ready: AtomicBool,
    /// `/metrics` is served on the webhook port too (no `metrics_addr` configured).
    pub(crate) metrics_on_webhook_port: bool,
    /// What requests hold: body bytes and in-flight permits (shown at scrape time).
    pub(crate) load: Load,
}

/// What the server's requests hold, process-wide.
#[derive(Debug)]
pub(crate) struct Load {
    /// Bytes of request bodies held (compressed and inflated alike).
    bodies: Arc<Budget>,
    /// Permits for `/mutate` requests being answered.
    requests: Arc<Semaphore>,
    max_requests: usize,
}

impl Load {
    pub(crate) fn new(limits: &ServerLimits) -> Self {
        Self {
            bodies: Arc::new(Budget::new(body::PROCESS_BODY_BUDGET)),
            requests: Arc::new(Semaphore::new(limits.max_requests_in_flight)),
            max_requests: limits.max_requests_in_flight,
        }
    }
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

/// The request's `Content-Length`, if it has a readable one.
fn declared_length(req: &Request<Incoming>) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// An error the client caused by being slow or by the server being full; says so and closes
/// an HTTP/1.1 connection whose body was left unread.
fn refuse(status: StatusCode, reason: &str) -> Response<Body> {
    let mut response = json_error(status, reason);
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

/// Reads the body by `deadline`, within the size limit and the memory budgets, un-gzipping it
/// if needed (the inflated copy reserved as it grows). The returned reservation pays for the
/// body: keep it while the body lives.
async fn read_body(
    server: &Server,
    connection: &ConnectionState,
    req: Request<Incoming>,
    deadline: tokio::time::Instant,
) -> Result<(Bytes, Reservation), Response<Body>> {
    let too_large = || {
        json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("body larger than {MAX_BODY_BYTES} bytes"),
        )
    };
    let metrics = &server.app.metrics;
    let declared = declared_length(&req);
    let encoding = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let mut reservation =
        Reservation::new(connection.bodies.clone(), server.app.load.bodies.clone());
    let read = async {
        let body = body::read(req.into_body(), declared, &mut reservation).await?;
        match encoding.as_deref() {
            None | Some("identity") | Some("") => Ok(Ok(body)),
            Some("gzip") => body::inflate(body, &mut reservation).map(Ok),
            Some(other) => Ok(Err(json_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("unsupported Content-Encoding {other:?} (gzip or none)"),
            ))),
        }
    };
    let body = match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(Ok(body))) => body,
        Ok(Ok(Err(unsupported))) => return Err(unsupported),
        Ok(Err(body::BodyError::TooLarge)) => return Err(too_large()),
        Ok(Err(body::BodyError::OverBudget)) => {
            metrics.request_refused("body_memory");
            return Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: too many request bodies being read at once",
            ));
        }
        Ok(Err(body::BodyError::Unreadable(e))) => {
            return Err(json_error(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the body: {e}"),
            ))
        }
        Ok(Err(body::BodyError::NotGzip(e))) => {
            return Err(json_error(
                StatusCode::BAD_REQUEST,
                &format!("body is not valid gzip: {e}"),
            ))
        }
        Err(_) => {
            metrics.request_refused("read_timeout");
            return Err(refuse(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the request was not received within {:?} (request_read_timeout)",
                    server.limits.request_read_timeout
                ),
            ));
        }
    };
    Ok((body, reservation))
}

async fn mutate(
    server: &Server,
    connection: &ConnectionState,
    read_deadline: tokio::time::Instant,
    req: Request<Incoming>,
) -> Response<Body> {
    let state = &server.app;
    let started = Instant::now();
    let budget = crate::budget::for_query(req.uri().query());
    let (body, mut reservation) = match read_body(server, connection, req, read_deadline).await {
        Ok(read) => read,
        Err(response) => {
            state
                .metrics
                .admission(Outcome::BadRequest, started.elapsed());
            return response;
        }
    };
    let _in_flight = match take_in_flight(server, &mut reservation, body.len()) {
        Ok(permit) => permit,
        Err(busy) => return *busy,
    };
    // The request's uid tags what is logged while it is answered, at debug level; the one info
    // line per admission names it itself (a span per admission at info costs about a
    // microsecond: BENCHMARKS.md).
    let span = tracing::debug_span!("admission", uid = tracing::field::Empty);
    let result = state
        .admission
        .review(&body, budget)
        .instrument(span.clone())
        .await;
    let _entered = span.enter();
    match result {
        Ok(reviewed) => {
            let outcome = reviewed.answer.outcome();
            let summary = reviewed.answer.decision.summary();
            tracing::info!(
                uid = %reviewed.out.response.uid,
                outcome = outcome.label(),
                allowed = reviewed.out.response.allowed,
                patched = reviewed.out.response.patch.is_some(),
                warnings = reviewed.out.response.warnings.len(),
                elapsed_us = started.elapsed().as_micros() as u64,
                "{summary}"
            );
            state.metrics.admission(outcome, started.elapsed());
            connection.served();
            // Under enforce = false nothing is denied: counted as what would have been.
            if let Some(would_deny) = reviewed.answer.not_enforced() {
                state.metrics.not_enforced(would_deny);
            } else if let crate::mutate::Decision::Denied { why, .. } = &reviewed.answer.decision {
                state.metrics.denied(*why);
            }
            respond(StatusCode::OK, "application/json", reviewed.out.to_json())
        }
        Err(e) => {
            tracing::warn!(error = %e, "rejected a request that is not an AdmissionReview");
            state
                .metrics
                .admission(Outcome::BadRequest, started.elapsed());
            json_error(StatusCode::BAD_REQUEST, &e.to_string())
        }
    }
}

/// What an admission whose body is read takes before it is answered: memory for what is parsed
/// out of the body, and an in-flight permit; a 503 when either is exhausted.
fn take_in_flight(
    server: &Server,
    reservation: &mut Reservation,
    body_len: usize,
) -> Result<OwnedSemaphorePermit, Box<Response<Body>>> {
    let state = &server.app;
    // What is parsed out of the body lives as long as it, and counts too: without this, 16
    // gzip-bombed 3 MiB admissions in flight held ~7.5 MiB each against a budget of 3 MiB each.
    if !reservation.cover_admission(body_len) {
        state.metrics.request_refused("body_memory");
        return Err(Box::new(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy: too many request bodies being answered at once",
        )));
    }
    // Taken once the body is read, not before: bodies are bounded by the body budgets and the
    // read deadline, and stalled ones holding these permits locked out the API server's own
    // requests (issue 23). The permits bound the work: lookups, parsing, answers.
    state
        .load
        .requests
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            state.metrics.request_refused("requests_in_flight");
            Box::new(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "busy: {} requests in flight (max_requests_in_flight)",
                    server.limits.max_requests_in_flight
                ),
            ))
        })
}

/// What every connection's requests share.
struct Server {
    app: Arc<AppState>,
    limits: ServerLimits,
    /// Client connections' slots.
    slots: Arc<Slots>,
}

/// The Prometheus exposition, with the gauges read at scrape time brought up to date:
/// OpenMetrics when the scraper asks for it (Prometheus does), else the Prometheus text format
/// (curl, `promtool check metrics`).
async fn metrics(state: &AppState, req: &Request<Incoming>) -> Response<Body> {
    state
        .metrics
        .set_cache_entries(state.resolver.cached_entries().await);
    let load = &state.load;
    state.metrics.set_request_load(
        load.bodies.used(),
        load.max_requests - load.requests.available_permits(),
    );
    state.metrics.set_ready(readiness(state).is_ok());
    if let Some(nodes) = &state.nodes {
        state.metrics.set_node_watch_synced(nodes.last_synced());
        state.metrics.set_node_watch_size(
            nodes.pool_builds(),
            nodes.node_count(),
            nodes.events_seen(),
        );
        if let Some(pools) = nodes.pools() {
            state.metrics.set_architectures(&pools);
        }
    }
    let open_metrics = req
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.contains("application/openmetrics-text"));
    if open_metrics {
        respond(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            crate::metrics::encode(&state.metrics_registry),
        )
    } else {
        respond(
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
                        (&Method::GET, "/healthz") => respond(StatusCode::OK, "text/plain", "ok\n"),
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

async fn route(
    server: Arc<Server>,
    connection: Arc<ConnectionState>,
    probe_only: bool,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (_active, head_started) = connection.request_started();
    let version = req.version();
    let is_probe = matches!(
        (req.method(), req.uri().path()),
        (&Method::GET, "/healthz" | "/readyz")
    );
    // A connection let in past the cap for probes that asks for more takes an idle
    // connection's slot when there is one.
    let probe_only = probe_only && (is_probe || !promote(&server, &connection));
    let read_timeout = if probe_only {
        PROBE_TIMEOUT
    } else {
        server.limits.request_read_timeout
    };
    let read_deadline = head_started.unwrap_or_else(tokio::time::Instant::now) + read_timeout;
    let state = &server.app;
    let mut response = match (req.method(), req.uri().path()) {
        // Probes are answered before any cap: a full server is alive, not dead.
        (&Method::GET, "/healthz" | "/readyz") => probe(state, req.uri().path()),
        _ if probe_only => {
            state.metrics.request_refused("too_many_connections");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: too many connections (max_connections)",
            )
        }
        (&Method::POST, "/mutate") => mutate(&server, &connection, read_deadline, req).await,
        (&Method::GET, "/metrics") if state.metrics_on_webhook_port => metrics(state, &req).await,
        (&Method::GET, "/metrics") => json_error(
            StatusCode::NOT_FOUND,
            "not found: metrics are served on metrics_addr",
        ),
        (_, "/mutate" | "/healthz" | "/readyz" | "/metrics") => {
            json_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => json_error(
            StatusCode::NOT_FOUND,
            "not found: the webhook path is /mutate",
        ),
    };
    if version == http::Version::HTTP_2 {
        // Connection-specific headers are malformed in h2 (RFC 9113 §8.2.2); h2 closes streams,
        // not connections.
        response.headers_mut().remove(header::CONNECTION);
    }
    Ok(response)
}

/// Gives `connection` (let in for probes) a regular slot, taken back from an idle connection if
/// need be; whether it has one now.
fn promote(server: &Server, connection: &ConnectionState) -> bool {
    if connection.has_slot() {
        return true;
    }
    match server.slots.promote(connection.peer) {
        Some(slot) => {
            connection.promote(slot);
            true
        }
        None => false,
    }
}

/// Whether the webhook is ready (serving, and the node watch synced when enabled); else why not.
fn readiness(state: &AppState) -> Result<(), &'static str> {
    if !state.ready.load(Ordering::Relaxed) {
        Err("not ready: shutting down\n")
    } else if !state.nodes.as_ref().is_none_or(|n| n.is_synced()) {
        Err("not ready: node watch not synced\n")
    } else {
        Ok(())
    }
}

/// `/healthz` (alive) and `/readyz` (serving and synced).
fn probe(state: &AppState, path: &str) -> Response<Body> {
    if path == "/healthz" {
        return respond(StatusCode::OK, "text/plain", "ok\n");
    }
    match readiness(state) {
        Ok(()) => respond(StatusCode::OK, "text/plain", "ok\n"),
        Err(why) => respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why),
    }
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime does at start: the
/// usual soft limit of 1024 would cap connections far below `max_connections`. Returns the soft
/// limit now in force (`None`: unlimited).
pub(crate) fn raise_fd_limit() -> std::io::Result<Option<u64>> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    let below_hard = match (limit.current, limit.maximum) {
        (Some(current), Some(maximum)) => current < maximum,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if below_hard {
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit).map_err(std::io::Error::from)?;
    }
    Ok(limit.current)
}

/// `configured`, lowered so that every connection (probes' headroom and connections still
/// closing after their slot was taken back included) and
/// [`RESERVED_FDS`] fit under the soft limit on open files: past it, `accept` fails and nothing,
/// `/healthz` included, gets through.
fn connection_cap(configured: usize) -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let Some(soft) = soft else {
        return configured;
    };
    let fit = soft.saturating_sub(RESERVED_FDS + (PROBE_CONNECTIONS + slots::MAX_CLOSING) as u64);
    let fit = usize::try_from(fit).unwrap_or(usize::MAX).max(1);
    if fit < configured {
        tracing::warn!(
            max_connections = configured,
            open_files_limit = soft,
            lowered_to = fit,
            "max_connections does not fit the limit on open files; lowered"
        );
        fit
    } else {
        configured
    }
}

/// One protocol builder per kind of connection. `keep_alive: false` for probe-only connections.
fn http_builder(keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(keep_alive)
        .max_buf_size(H1_MAX_BUF_SIZE)
        // hyper's head timer also runs while a keep-alive connection is idle, which would cut
        // connection_idle_timeout short; the connection watchdog times heads instead.
        .header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
    builder
}

/// Serves on `listener` until `shutdown` completes, then stops accepting, reports not ready, and
/// gives in-flight requests [`SHUTDOWN_GRACE`] to finish.
pub(crate) async fn run(
    listener: TcpListener,
    certs: Arc<CertStore>,
    state: Arc<AppState>,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(certs.server_config());
    let max_connections = connection_cap(limits.max_connections);
    let slots = Slots::new(max_connections, limits.max_connections_per_peer);
    let probe_connections = Arc::new(Semaphore::new(PROBE_CONNECTIONS));
    let builders = Arc::new([http_builder(true), http_builder(false)]);
    let server = Arc::new(Server {
        app: state.clone(),
        slots: slots.clone(),
        limits,
    });
    let (stop, stopping) = watch::channel(());
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
        let mut slot = slots.admit(peer.ip());
        if slot.is_none() {
            // Too many connections whose slots were taken back are still closing (a flood
            // accepted faster than the workers close them): wait for one, briefly, instead of
            // refusing; the backlog holds the next connections meanwhile.
            let room = slots.room_to_reclaim();
            if tokio::time::timeout(PROBE_TIMEOUT, room).await.is_ok() {
                slot = slots.admit(peer.ip());
            }
        }
        let permit = match slot {
            Some(slot) => Permit::Slot(slot),
            None => match probe_connections.clone().try_acquire_owned() {
                Ok(permit) => Permit::Probes { _held: permit },
                Err(_) => {
                    // Closing at once costs the client a retry and us nothing; queueing would
                    // hold the descriptor the flood is trying to exhaust.
                    state.metrics.connection_refused();
                    drop(tcp);
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(serve_connection(
            tcp,
            peer,
            permit,
            acceptor.clone(),
            builders.clone(),
            server.clone(),
            stopping.clone(),
        ));
    }
    state.ready.store(false, Ordering::Relaxed);
    drop(listener);
    drain(stop, &slots, &probe_connections).await;
}

/// What lets a connection in: a slot, or the probes' headroom past the cap.
enum Permit {
    Slot(Slot),
    /// Held while the connection lives.
    Probes {
        _held: OwnedSemaphorePermit,
    },
}

impl Permit {
    /// Resolves when the slot was taken back for another connection; never for the probes'.
    async fn reclaimed(&self) {
        match self {
            Self::Slot(slot) => slot.reclaimed().await,
            Self::Probes { .. } => std::future::pending().await,
        }
    }
}

/// Tells every connection to finish (dropping `stop`) and waits, at most [`SHUTDOWN_GRACE`],
/// for them to end (each holds a slot or a permit of `probe_connections` until its task ends).
async fn drain(stop: watch::Sender<()>, slots: &Slots, probe_connections: &Semaphore) {
    let open = slots.held() + PROBE_CONNECTIONS - probe_connections.available_permits();
    tracing::info!(
        connections = open,
        "shutting down: finishing requests in flight"
    );
    drop(stop);
    let all_closed = async {
        slots.all_closed().await;
        let all = u32::try_from(PROBE_CONNECTIONS).unwrap_or(u32::MAX);
        let _ = probe_connections.acquire_many(all).await;
    };
    match tokio::time::timeout(SHUTDOWN_GRACE, all_closed).await {
        Ok(()) => tracing::info!("all connections closed"),
        Err(_) => {
            tracing::warn!("shutdown grace period over; closing remaining connections")
        }
    }
}

/// The TLS handshake, within `read_timeout` and while the connection keeps its slot.
async fn handshake(
    tcp: TcpStream,
    peer: std::net::SocketAddr,
    permit: &Permit,
    acceptor: &TlsAcceptor,
    read_timeout: Duration,
    metrics: &Metrics,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let handshake = tokio::time::timeout(read_timeout, acceptor.accept(tcp));
    tokio::select! {
        accepted = handshake => match accepted {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                metrics.connection_closed("idle");
                None
            }
        },
        () = permit.reclaimed() => {
            metrics.connection_closed("reclaimed");
            None
        }
    }
}

/// How a connection's serving ended.
enum Ended {
    /// Idle too long, or a request head too slow.
    Idle,
    /// Its slot was taken back for another connection.
    Reclaimed,
    /// The server is shutting down.
    ShuttingDown,
}

/// One client connection: TLS, then HTTP/1.1 or h2 under a watchdog that closes it when idle
/// (or when a request head is too slow), when its slot is taken back, and on shutdown.
async fn serve_connection(
    tcp: TcpStream,
    peer: std::net::SocketAddr,
    permit: Permit,
    acceptor: TlsAcceptor,
    builders: Arc<[auto::Builder<TokioExecutor>; 2]>,
    server: Arc<Server>,
    mut stopping: watch::Receiver<()>,
) {
    let metrics = server.app.metrics.clone();
    let _open = metrics.connection_opened();
    let (slot, probe_only) = match &permit {
        Permit::Slot(slot) => (Some(slot.handle()), false),
        Permit::Probes { .. } => (None, true),
    };
    let (read_timeout, idle_timeout) = if probe_only {
        (PROBE_TIMEOUT, PROBE_TIMEOUT)
    } else {
        (
            server.limits.request_read_timeout,
            server.limits.connection_idle_timeout,
        )
    };
    let Some(stream) = handshake(tcp, peer, &permit, &acceptor, read_timeout, &metrics).await
    else {
        return;
    };
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    let state = ConnectionState::new(!h2, body::CONNECTION_BODY_BUDGET, peer.ip(), slot);
    let io = TokioIo::new(Tracked::new(stream, state.clone()));
    let service = {
        let (server, state) = (server.clone(), state.clone());
        hyper::service::service_fn(move |req| route(server.clone(), state.clone(), probe_only, req))
    };
    let connection = builders[usize::from(probe_only)].serve_connection(io, service);
    tokio::pin!(connection);
    let ended = loop {
        let deadline = state.deadline(idle_timeout, read_timeout);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = sleep_until(deadline) => {
                let due = state.deadline(idle_timeout, read_timeout);
                if due.is_some_and(|due| due <= tokio::time::Instant::now()) {
                    tracing::debug!(%peer, "closing an idle connection");
                    metrics.connection_closed("idle");
                    break Ended::Idle;
                }
            }
            () = state.changed() => {}
            () = permit.reclaimed() => {
                tracing::debug!(%peer, "closing a connection whose slot was taken back");
                metrics.connection_closed("reclaimed");
                break Ended::Reclaimed;
            }
            _ = stopping.changed() => break Ended::ShuttingDown,
        }
    };
    // Finishes the request in progress (h2: sends GOAWAY); a client that does not read its
    // answer is not waited for beyond the grace.
    connection.as_mut().graceful_shutdown();
    let grace = match ended {
        Ended::ShuttingDown => SHUTDOWN_GRACE,
        Ended::Idle => read_timeout,
        // Its slot is someone else's already: it counts as closing, of which few may be.
        Ended::Reclaimed => PROBE_TIMEOUT,
    };
    match tokio::time::timeout(grace, connection).await {
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
        Ok(Ok(())) => {}
        Err(_) => tracing::debug!(%peer, "connection dropped after its grace period"),
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
