//! HTTPS transport: TLS (rotation-safe), HTTP/1.1 keep-alive and h2, deadlines, graceful
//! shutdown, and the limits that keep abusive clients from exhausting memory or file
//! descriptors. Everything it decides comes from [`Admission`]; what it reports of the rest of
//! the webhook (readiness, the gauges read at scrape time) comes as closures built in `app.rs`.
//!
//! Parts: `routes` (routing and the `/mutate` endpoint: bodies, in-flight permits), `probes`
//! (`/healthz`, `/readyz`), `scrape` (`/metrics`, on this port or `metrics_addr`), `body`,
//! `connection`, `slots`, `tls`.

pub mod body;
pub mod connection;
mod probes;
mod routes;
mod scrape;
pub(crate) mod slots;
pub mod tls;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::admission::Admission;
use crate::metrics::Metrics;

use self::body::BodyBudgets;
use self::connection::{ConnectionState, Tracked};
use self::slots::{Slot, Slots};
use self::tls::CertStore;

pub(crate) use self::probes::ReadinessCheck;
pub(crate) use self::scrape::{serve_metrics, GaugeRefresh};

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
    pub(crate) metrics: Arc<Metrics>,
    pub metrics_registry: prometheus_client::registry::Registry,
    /// Ready once serving; not ready while shutting down.
    pub ready: AtomicBool,
    /// What else holds readiness back (the node watch not synced yet), built in `app.rs`.
    pub(crate) readiness: ReadinessCheck,
    /// Sets the gauges of the rest of the webhook read at scrape time (the lookup cache, the
    /// node watch), built in `app.rs`.
    pub(crate) refresh_gauges: GaugeRefresh,
    /// `/metrics` is served on the webhook port too (no `metrics_addr` configured).
    pub(crate) metrics_on_webhook_port: bool,
    /// What requests hold: body bytes and in-flight permits (shown at scrape time).
    pub(crate) load: Load,
}

/// What the server's requests hold, process-wide.
#[derive(Debug)]
pub(crate) struct Load {
    /// Bytes of request bodies held (compressed and inflated alike), with each peer's share
    /// and the serving connections' reserve.
    bodies: Arc<BodyBudgets>,
    /// Permits for `/mutate` requests being answered.
    requests: Arc<Semaphore>,
    max_requests: usize,
}

impl Load {
    pub(crate) fn new(limits: &ServerLimits) -> Self {
        Self {
            bodies: Arc::new(BodyBudgets::shipped()),
            requests: Arc::new(Semaphore::new(limits.max_requests_in_flight)),
            max_requests: limits.max_requests_in_flight,
        }
    }
}

/// What every connection's requests share.
struct Server {
    app: Arc<AppState>,
    limits: ServerLimits,
    /// Client connections' slots.
    slots: Arc<Slots>,
}

impl Server {
    /// A new connection's state, with its body budget and its peer's share of the process's.
    fn connection_state(
        &self,
        track_heads: bool,
        peer: std::net::IpAddr,
        slot: Option<slots::SlotHandle>,
    ) -> Arc<ConnectionState> {
        let budgets = (
            body::CONNECTION_BODY_BUDGET,
            self.app.load.bodies.peer(peer),
        );
        ConnectionState::new(track_heads, budgets, peer, slot)
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
    let state = server.connection_state(!h2, peer.ip(), slot);
    let io = TokioIo::new(Tracked::new(stream, state.clone()));
    let service = {
        let (server, state) = (server.clone(), state.clone());
        hyper::service::service_fn(move |req| {
            routes::route(server.clone(), state.clone(), probe_only, req)
        })
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
