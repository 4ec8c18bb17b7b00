//! Routing, and the admission endpoint: `/mutate`'s body read within its deadline and the
//! memory budgets, an in-flight permit, the answer from [`Admission`](crate::admission::Admission)
//! logged and counted.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument as _;

use super::body::{self, Reservation};
use super::connection::ConnectionState;
use super::{probes, scrape, Server, MAX_BODY_BYTES, PROBE_TIMEOUT};

/// What every response of the server is.
pub(super) type Body = Full<Bytes>;

pub(super) fn http_response(
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

pub(super) fn json_error(status: StatusCode, reason: &str) -> Response<Body> {
    let body = serde_json::json!({"error": reason}).to_string();
    http_response(status, "application/json", body)
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
    let metrics = &server.app.metrics;
    let declared = declared_length(&req);
    let encoding = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let mut reservation = Reservation::new(
        connection.bodies.clone(),
        connection.peer_bodies.clone(),
        server.app.load.bodies.clone(),
        connection.has_served(),
    );
    let serving = connection.has_served();
    let h2 = req.version() == http::Version::HTTP_2;
    let window = body::Window {
        started: deadline
            .checked_sub(server.limits.request_read_timeout)
            .unwrap_or(deadline),
        deadline,
    };
    let read = async {
        let body = body::read(req.into_body(), declared, &mut reservation, h2, window).await?;
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
        Ok(Err(e)) => return Err(unread(server, serving, e)),
        Err(_) => {
            if let Some(refused) = reservation.refused() {
                metrics.body_refused(serving, refused.label());
            }
            if reservation.evicted() {
                // An HTTP/2 stream evicted, then drained until its deadline.
                metrics.body_evicted(serving);
            }
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

/// The answer to a body that could not be read (counted).
fn unread(server: &Server, serving: bool, error: body::BodyError) -> Response<Body> {
    let metrics = &server.app.metrics;
    match error {
        body::BodyError::TooLarge => json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("body larger than {MAX_BODY_BYTES} bytes"),
        ),
        body::BodyError::Evicted => {
            metrics.request_refused("body_memory");
            metrics.body_evicted(serving);
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: this body stalled while other requests needed the memory it held",
            )
        }
        body::BodyError::OverBudget(refused) => {
            metrics.request_refused("body_memory");
            metrics.body_refused(serving, refused.label());
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: too many request bodies being read at once",
            )
        }
        body::BodyError::Unreadable(e) => json_error(
            StatusCode::BAD_REQUEST,
            &format!("cannot read the body: {e}"),
        ),
        body::BodyError::NotGzip(e) => json_error(
            StatusCode::BAD_REQUEST,
            &format!("body is not valid gzip: {e}"),
        ),
    }
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
            state.metrics.bad_request(started.elapsed());
            return response;
        }
    };
    let _in_flight = match take_in_flight(
        server,
        (&mut reservation, connection.has_served()),
        body.len(),
        read_deadline,
    )
    .await
    {
        Ok(permit) => permit,
        Err(busy) => return *busy,
    };
    // The request's uid tags what is logged while it is answered, at debug level; the one info
    // line per admission names it itself (a span per admission at info costs about a
    // microsecond: BENCHMARKS.md).
    let span = tracing::debug_span!("admission", uid = tracing::field::Empty);
    let result = state
        .admission
        .answer_review(&body, budget)
        .instrument(span.clone())
        .await;
    let _entered = span.enter();
    match result {
        Ok(reviewed) => {
            let outcome = reviewed.outcome();
            let summary = reviewed.summary();
            crate::telemetry::AdmissionLine {
                uid: &reviewed.out.response.uid,
                outcome: outcome.label(),
                allowed: reviewed.out.response.allowed,
                patched: reviewed.out.response.patch.is_some(),
                warnings: reviewed.out.response.warnings.len(),
                elapsed_us: started.elapsed().as_micros() as u64,
                summary,
            }
            .log();
            state.metrics.admission(outcome, started.elapsed());
            connection.served();
            http_response(StatusCode::OK, "application/json", reviewed.out.to_json())
        }
        Err(e) => {
            tracing::warn!(error = %e, "rejected a request that is not an AdmissionReview");
            state.metrics.bad_request(started.elapsed());
            json_error(StatusCode::BAD_REQUEST, &e.to_string())
        }
    }
}

/// What an admission whose body is read takes before it is answered: memory for what is parsed
/// out of the body (stalled bodies evicted for it until `deadline`), and an in-flight permit; a
/// 503 when either is exhausted.
async fn take_in_flight(
    server: &Server,
    (reservation, serving): (&mut Reservation, bool),
    body_len: usize,
    deadline: tokio::time::Instant,
) -> Result<OwnedSemaphorePermit, Box<Response<Body>>> {
    let state = &server.app;
    // What is parsed out of the body lives as long as it, and counts too: without this, 16
    // gzip-bombed 3 MiB admissions in flight held ~7.5 MiB each against a budget of 3 MiB each.
    let covered = tokio::time::timeout_at(deadline, reservation.cover_admission(body_len))
        .await
        .unwrap_or(Err(body::Refused::Process));
    if let Err(refused) = covered {
        state.metrics.request_refused("body_memory");
        state.metrics.body_refused(serving, refused.label());
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

pub(super) async fn route(
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
        (&Method::GET, "/healthz" | "/readyz") => probes::probe(state, req.uri().path()),
        _ if probe_only => {
            state.metrics.request_refused("too_many_connections");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: too many connections (max_connections)",
            )
        }
        (&Method::POST, "/mutate") => mutate(&server, &connection, read_deadline, req).await,
        (&Method::GET, "/metrics") if state.metrics_on_webhook_port => {
            scrape::metrics(state, &req).await
        }
        (&Method::GET, "/metrics") => json_error(
            StatusCode::NOT_FOUND,
            "not found: metrics are served on server.metrics_addr",
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
