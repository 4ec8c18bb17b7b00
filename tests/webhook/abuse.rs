//! Abusive clients, all on 127.0.0.1 and bounded in time: bodies that never finish (HTTP/1.1
//! one-byte chunks, a `Content-Length` never reached, HTTP/2 streams), connections that stay
//! idle, a connection flood past `max_connections`, more requests than
//! `max_requests_in_flight`. Each is cut off within its deadline, the server's memory stays
//! bounded, and `/healthz` keeps answering. The memory tests run the real `tolerable serve` binary
//! (one worker thread, as the shipped Deployment) and read its RSS from /proc.

use crate::common;

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::webhook::{self, TestServer};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tolerable::server::{ServerLimits, MAX_BODY_BYTES};

/// A TLS connection to the server, offering `alpn` (`h2` or `http/1.1`).
async fn connect(addr: SocketAddr, alpn: &[u8]) -> TlsStream<TcpStream> {
    let mut config = (*common::certs::client_config()).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// Reads until the server closes the connection; `None` if it is still open after `limit`.
/// Returns what the server sent.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    limit: Duration,
) -> Option<Vec<u8>> {
    let mut received = Vec::new();
    let read_all = async {
        let mut buf = [0u8; 4096];
        // An error (reset, or no close_notify) is a close as well.
        while let Ok(n @ 1..) = stream.read(&mut buf).await {
            received.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(limit, read_all).await.ok()?;
    Some(received)
}

/// `GET /healthz` on a new connection, retried for up to `limit`: a server starting (`limit`
/// only keeps a server that never answers from hanging the test). Returns the time it took.
async fn healthz_answers_within(addr: SocketAddr, limit: Duration) -> Duration {
    let started = Instant::now();
    let client = webhook::client_builder()
        .timeout(Duration::from_millis(1500))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("https://localhost:{}/healthz", addr.port());
    loop {
        match client.get(&url).send().await {
            Ok(response) if response.status() == 200 => return started.elapsed(),
            other => assert!(
                started.elapsed() < limit,
                "/healthz did not answer within {limit:?}: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /healthz` on a new connection during an attack, tried as the kubelet tries (again after
/// a failure, up to its failure threshold of 3): answered 200 while the attack still holds
/// the server — before `attack_ends`, the first moment a deadline the test configured could
/// have ended it (the attack began before that deadline's clock started, so an answer before
/// it came while every attacking connection was still held). The bound is that configured
/// deadline, not the kubelet's 1 s timeout, which is this machine's speed. Returns the time the
/// answered try took (reported, not asserted).
async fn healthz_answers_during_the_attack(addr: SocketAddr, attack_ends: Instant) -> Duration {
    let client = webhook::client_builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("https://localhost:{}/healthz", addr.port());
    let mut failed = Vec::new();
    while failed.len() < 3 {
        let started = Instant::now();
        let left = attack_ends.saturating_duration_since(started);
        match tokio::time::timeout(left, client.get(&url).send()).await {
            Ok(Ok(response)) if response.status() == 200 => {
                assert!(
                    Instant::now() < attack_ends,
                    "/healthz answered only once the attack could have ended"
                );
                return started.elapsed();
            }
            Ok(other) => failed.push(format!("{other:?}")),
            Err(_) => panic!("/healthz unanswered while the attack held the server: {failed:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/healthz failed 3 probes in a row (the kubelet would restart the Pod): {failed:?}");
}

fn limits(read: Duration, idle: Duration) -> ServerLimits {
    ServerLimits {
        request_read_timeout: read,
        connection_idle_timeout: idle,
        ..ServerLimits::default()
    }
}

/// `tolerable serve` as a child process with the test certificate and `env`.
struct Served {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Served {
    /// Started under a low soft limit on open files, as many container runtimes set: serve
    /// raises it.
    async fn start(env: &[(&str, &str)]) -> Self {
        Self::start_with_ulimit("-Sn 256", env).await
    }

    /// `ulimit` is the shell's option and value for the open-files limit.
    async fn start_with_ulimit(ulimit: &str, env: &[(&str, &str)]) -> Self {
        common::init();
        let (dir, addr) = common::process::prepare();
        // The shell sets the limit, then becomes `serve` (its certificate, address and nothing
        // else from this process's environment, as `process::serve_command` gives any serve).
        let mut command = common::process::serve_command("/bin/sh", dir.path(), addr);
        command
            .arg("-c")
            .arg(format!(
                "ulimit {ulimit} && exec '{}' serve",
                // BENCHMARKS.md runs these attacks against a release build this way.
                std::env::var("ABUSE_SERVE_BIN")
                    .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tolerable").to_owned())
            ))
            .env("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false")
            .env("TOLERABLE_NODES__WATCH", "false")
            .env("TOLERABLE_SERVER__WORKER_THREADS", "1")
            .env("TOLERABLE_LOG__LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            command.env(k, v);
        }
        let served = Self {
            child: command.spawn().unwrap(),
            addr,
            _dir: dir,
        };
        healthz_answers_within(addr, Duration::from_secs(20)).await;
        served
    }

    fn rss_kib(&self) -> u64 {
        common::rss_kib(self.child.id())
    }

    /// The highest RSS seen until the returned flag is set, sampled every 10 ms.
    fn sample_peak_rss(&self) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
        let stop = Arc::new(AtomicBool::new(false));
        let pid = self.child.id();
        let peak = AtomicU64::new(0);
        let handle = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(common::rss_kib(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
                peak.load(Ordering::Relaxed)
            }
        });
        (stop, handle)
    }

    /// `Max open files` from /proc: (soft, hard).
    fn open_files_limit(&self) -> (String, String) {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id())).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields[3].to_owned(), fields[4].to_owned())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request whose body is sent as `chunks` one-byte chunks, as fast as the server
/// takes them, and then never finished. Returns when the server closed the connection, all it
/// answered, and how many chunks were written; `None` if it was still open after `limit`.
async fn one_byte_chunks_never_finished(
    addr: SocketAddr,
    chunks: usize,
    limit: Duration,
) -> Option<(Duration, String, usize)> {
    let tls = connect(addr, b"http/1.1").await;
    let (mut reader, mut writer) = tokio::io::split(tls);
    let started = Instant::now();
    writer
        .write_all(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let batch = b"1\r\n \r\n".repeat(4096);
    let sent = std::sync::atomic::AtomicUsize::new(0);
    let write = async {
        while sent.load(Ordering::Relaxed) < chunks && writer.write_all(&batch).await.is_ok() {
            sent.fetch_add(4096, Ordering::Relaxed);
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        closed = closed_within(&mut reader, limit) => {
            closed.map(|response| {
                let answer = String::from_utf8_lossy(&response).into_owned();
                (started.elapsed(), answer, sent.load(Ordering::Relaxed))
            })
        }
        () = write => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_one_byte_chunks_are_cut_off_at_the_read_deadline_with_bounded_memory() {
    let served = Served::start(&[
        (
            "TOLERABLE_SERVER__REQUEST_READ_TIMEOUT",
            STREAMS_READ_TIMEOUT_SETTING,
        ),
        ("TOLERABLE_SERVER__CONNECTION_IDLE_TIMEOUT", "30s"),
    ])
    .await;
    let (soft, hard) = served.open_files_limit();
    assert_eq!(soft, hard, "the soft limit on open files was not raised");
    let baseline = served.rss_kib();
    let (stop, peak) = served.sample_peak_rss();
    let started = Instant::now();
    let mut connections = Vec::new();
    for _ in 0..8 {
        connections.push(tokio::spawn(one_byte_chunks_never_finished(
            served.addr,
            3_000_000,
            STREAMS_IDLE_TIMEOUT,
        )));
    }
    // The attack under way (not a bound: the probe's bound is the read deadline below).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let probe =
        healthz_answers_during_the_attack(served.addr, started + STREAMS_READ_TIMEOUT).await;
    let mut chunks_sent = 0;
    for connection in connections {
        let (closed_after, status, sent) = connection
            .await
            .unwrap()
            .expect("a stalled body was still being read at the idle timeout");
        // 408 at the deadline, or 413 if the client managed 3 MiB of chunks before it; a 408
        // names the deadline the server applied, the one configured here.
        assert!(
            status.starts_with("HTTP/1.1 408") || status.starts_with("HTTP/1.1 413"),
            "{status}"
        );
        if status.starts_with("HTTP/1.1 408") {
            let applied = format!("within {STREAMS_READ_TIMEOUT:?} (request_read_timeout)");
            assert!(status.contains(&applied), "{status}");
        }
        // Cut off by the read deadline, not left to the connection's next one, the idle
        // timeout (how soon after the read deadline is the machine's speed).
        assert!(
            closed_after < STREAMS_IDLE_TIMEOUT,
            "closed after {closed_after:?}"
        );
        chunks_sent += sent;
    }
    stop.store(true, Ordering::Relaxed);
    let peak = peak.join().unwrap();
    let grew_mib = peak.saturating_sub(baseline) as f64 / 1024.0;
    eprintln!(
        "8 HTTP/1.1 connections, {chunks_sent} one-byte chunks written: RSS {:.1} MiB before, peak {:.1} MiB (+{grew_mib:.1} MiB); /healthz answered in {probe:?}; all closed after {:?}",
        baseline as f64 / 1024.0,
        peak as f64 / 1024.0,
        started.elapsed()
    );
    // Eight bodies of at most 3 MiB each in one buffer apiece, plus TLS and HTTP buffers.
    assert!(grew_mib < 48.0, "RSS grew by {grew_mib:.1} MiB");
}

/// What a stream was answered, and when (since the test started).
type StreamAnswer = (
    Duration,
    Result<Result<http::StatusCode, h2::Error>, tokio::time::error::Elapsed>,
);

/// Each stream's answer counted by kind (a status, "refused", or the reset), with the last
/// answer's time and the first 408's.
async fn stream_answers(
    streams: Vec<tokio::task::JoinHandle<StreamAnswer>>,
) -> (
    std::collections::BTreeMap<String, usize>,
    Duration,
    Duration,
) {
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    let (mut last, mut first_408) = (Duration::ZERO, Duration::MAX);
    for stream in streams {
        let (after, answered) = stream.await.unwrap();
        let answered = answered.expect("an unfinished stream was not answered by the idle timeout");
        last = last.max(after);
        if matches!(&answered, Ok(status) if status.as_u16() == 408) {
            first_408 = first_408.min(after);
        }
        // A client that opens streams before it has the server's SETTINGS may exceed
        // max_concurrent_streams: those are refused at once too, at the protocol level.
        let status = match answered {
            Ok(status) => status.as_u16().to_string(),
            Err(e) if e.reason() == Some(h2::Reason::REFUSED_STREAM) => "refused".to_owned(),
            Err(e) => format!("reset: {e}"),
        };
        *statuses.entry(status).or_default() += 1;
    }
    (statuses, last, first_408)
}

/// The connection idle timeout the stalled-body tests set: the deadline after the read timeout.
const STREAMS_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The one-byte-chunks test's read timeout, as set (the setting and its value): long enough
/// that /healthz is asked while the attack still holds the server.
const STREAMS_READ_TIMEOUT_SETTING: &str = "5s";
const STREAMS_READ_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_http2_streams_are_answered_within_the_deadline_with_bounded_memory() {
    let read = Duration::from_secs(2);
    let served = Served::start(&[
        ("TOLERABLE_SERVER__REQUEST_READ_TIMEOUT", "2s"),
        ("TOLERABLE_SERVER__CONNECTION_IDLE_TIMEOUT", "30s"),
    ])
    .await;
    let baseline = served.rss_kib();
    let (stop, peak) = served.sample_peak_rss();
    let started = Instant::now();
    let tls = connect(served.addr, b"h2").await;
    let (mut client, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(connection);
    // Each stream declares 3 MiB and sends one byte less. One buffer, shared by all streams,
    // keeps the client's own memory small.
    let almost = Bytes::from(vec![b' '; MAX_BODY_BYTES - 1]);
    let mut streams = Vec::new();
    let mut probe = None;
    for i in 0..200 {
        // Asked while the streams are being opened (opening all 200 takes longer than the read
        // deadline on a debug build): the attack is under way, none cut off yet.
        if i == 10 {
            probe = Some(tokio::spawn(healthz_answers_during_the_attack(
                served.addr,
                started + read,
            )));
        }
        client = client.ready().await.unwrap();
        let request = http::Request::post("https://localhost/mutate")
            .header("content-type", "application/json")
            .header("content-length", MAX_BODY_BYTES)
            .body(())
            .unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        // The server may answer (503) and reset a stream past the connection's body budget as
        // soon as its head arrives; sending on it then fails, and its answer is still read
        // below (with a release server this race is won by the server in about 1 run in 12).
        let _ = body.send_data(almost.clone(), false);
        streams.push(tokio::spawn(async move {
            let _unfinished = body;
            let answered = tokio::time::timeout(STREAMS_IDLE_TIMEOUT, response).await;
            (started.elapsed(), answered.map(|r| r.map(|r| r.status())))
        }));
    }
    let probe = probe.unwrap().await.unwrap();
    let (statuses, last, first_408) = stream_answers(streams).await;
    stop.store(true, Ordering::Relaxed);
    let peak = peak.join().unwrap();
    let grew_mib = peak.saturating_sub(baseline) as f64 / 1024.0;
    eprintln!(
        "1 HTTP/2 connection, 200 streams of 3 MiB - 1 byte: RSS {:.1} MiB before, peak {:.1} MiB (+{grew_mib:.1} MiB); answers {statuses:?}, the last after {last:?}; /healthz answered in {probe:?}",
        baseline as f64 / 1024.0,
        peak as f64 / 1024.0,
    );
    // Bodies are reserved as their bytes arrive (issue 34), not as declared: every stream is
    // read as far as its bytes come (h2's flow control paces them) and, never finished, gets
    // 408 at the read deadline — or 503 once its bytes pass the connection's body budget (its
    // body then read on and dropped, so the client sends no DATA on a reset stream), or
    // REFUSED_STREAM past max_concurrent_streams. Memory stays bounded either way (below).
    let answered: usize = statuses.values().sum();
    assert_eq!(answered, 200, "{statuses:?}");
    assert!(
        statuses
            .keys()
            .all(|k| ["503", "refused", "408"].contains(&k.as_str())),
        "{statuses:?}"
    );
    assert!(statuses.contains_key("408"), "{statuses:?}");
    // A 408 never before the read deadline (the clock started before the connection), and
    // every answer before the connection's next deadline, the idle timeout (how soon after the
    // read deadline is the machine's speed).
    assert!(first_408 >= read, "a 408 after {first_408:?}");
    assert!(last < STREAMS_IDLE_TIMEOUT, "last answer after {last:?}");
    assert!(grew_mib < 48.0, "RSS grew by {grew_mib:.1} MiB");
}

/// The bounds the code guarantees, whatever the machine's speed: a request not received within
/// `request_read_timeout` (1 s) is cut off by that deadline — never before it (the clock starts
/// before the connection does, so nothing the server does can make it look early), and before
/// the connection's next deadline, the idle timeout (30 s), which is what would end it were the
/// read deadline ignored, pushed back by each byte, or never set. (How soon after the deadline
/// the answer comes is the machine's speed: issue 29 keeps such figures out of tests.)
#[tokio::test]
async fn a_content_length_never_reached_gets_408_at_the_deadline_and_the_connection_closes() {
    let (read, idle) = (Duration::from_secs(1), Duration::from_secs(30));
    let server = TestServer::start_with_limits(limits(read, idle)).await;
    let started = Instant::now();
    let mut tls = connect(server.addr, b"http/1.1").await;
    tls.write_all(
        b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-length: 100000\r\n\r\n{\"kind\":",
    )
    .await
    .unwrap();
    let response = closed_within(&mut tls, idle)
        .await
        .expect("still reading the body at the idle timeout");
    let elapsed = started.elapsed();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    // The deadline the server says it applied is the one configured here.
    assert!(
        text.contains(&format!("within {read:?} (request_read_timeout)")),
        "{text}"
    );
    assert!(elapsed >= read && elapsed < idle, "{elapsed:?}");
    let metrics = tolerable::metrics::encode(&server.state.metrics_registry);
    assert_eq!(
        webhook::metric_value(
            &metrics,
            "tolerable_requests_refused_total{reason=\"read_timeout\"}"
        ),
        Some(1.0),
        "{metrics}"
    );

    // A head sent one byte at a time, as long as the server takes it, is held to the same
    // deadline: each byte does not push it back.
    let started = Instant::now();
    let mut tls = connect(server.addr, b"http/1.1").await;
    let slow_head = async {
        for byte in b"POST /mutate HTTP/1.1\r\nhost: localhost\r\n"
            .iter()
            .cycle()
        {
            if tls.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let cut_off = tokio::time::timeout(idle, slow_head).await;
    let elapsed = started.elapsed();
    assert!(
        cut_off.is_ok(),
        "a head trickling in for {elapsed:?} was not cut off"
    );
    assert!(elapsed >= read && elapsed < idle, "{elapsed:?}");
}

/// How long past the idle timeout a test waits before calling a connection left open.
const IDLE_HANG_GUARD: Duration = Duration::from_secs(30);

#[tokio::test]
async fn idle_connections_are_closed_http1_and_h2() {
    // The read timeout shorter than the idle one: a silent connection closed before the idle
    // timeout was closed by the read timeout (the order of the two configured deadlines, not
    // a margin for this machine's speed).
    let (read, idle) = (Duration::from_secs(1), Duration::from_secs(4));
    let server = TestServer::start_with_limits(limits(read, idle)).await;

    // Silent after the handshake: the first request is due within the read timeout.
    for alpn in [b"http/1.1".as_slice(), b"h2"] {
        let started = Instant::now();
        let mut tls = connect(server.addr, alpn).await;
        closed_within(&mut tls, idle + IDLE_HANG_GUARD)
            .await
            .expect("a silent connection was left open");
        let lasted = started.elapsed();
        assert!(
            lasted < idle,
            "closed after {lasted:?}: not by the read timeout of {read:?}"
        );
    }

    // HTTP/1.1 keep-alive after a request: open until the idle timeout — never before it (the
    // clock starts before the request, so the server's idle timer starts after it) — then
    // closed, within a hang guard (how soon after the timeout is the machine's speed).
    let mut tls = connect(server.addr, b"http/1.1").await;
    let asked = Instant::now();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tls.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    closed_within(&mut tls, idle + IDLE_HANG_GUARD)
        .await
        .expect("an idle HTTP/1.1 connection was left open");
    let lasted = asked.elapsed();
    assert!(
        lasted >= idle,
        "closed after {lasted:?}, before the idle timeout"
    );

    // h2 after a request: GOAWAY and closed after the idle timeout.
    let tls = connect(server.addr, b"h2").await;
    let (mut client, connection) = h2::client::handshake(tls).await.unwrap();
    let connection = tokio::spawn(connection);
    let request = http::Request::get("https://localhost/healthz")
        .body(())
        .unwrap();
    let asked = Instant::now();
    let (response, _) = client.send_request(request, true).unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
    tokio::time::timeout(idle + IDLE_HANG_GUARD, connection)
        .await
        .expect("an idle h2 connection was left open")
        .unwrap()
        .unwrap();
    let lasted = asked.elapsed();
    assert!(
        lasted >= idle,
        "closed after {lasted:?}, before the idle timeout"
    );
    let metrics = tolerable::metrics::encode(&server.state.metrics_registry);
    assert_eq!(
        webhook::metric_value(
            &metrics,
            "tolerable_connections_closed_total{reason=\"idle\"}"
        ),
        Some(4.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_past_the_cap_is_refused_while_healthz_answers() {
    let server = TestServer::start_with_limits(ServerLimits {
        max_connections: 20,
        ..limits(Duration::from_secs(2), Duration::from_secs(30))
    })
    .await;
    // The cap's worth of connections, each having made a request and staying open.
    let mut held = Vec::new();
    for _ in 0..20 {
        let mut tls = connect(server.addr, b"http/1.1").await;
        tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = tls.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(tls);
    }
    // Held from here until their idle timeout (30 s) at the earliest.
    let held_until = Instant::now() + Duration::from_secs(30);
    // Then a flood of plain TCP connections that say nothing.
    let started = Instant::now();
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(TcpStream::connect(server.addr).await.unwrap());
    }
    // Every one closed, while the cap is still full (the hang guard is the held connections'
    // idle timeout); the refused count below says how many were refused at accept.
    for tcp in &mut flood {
        let left = held_until.saturating_duration_since(Instant::now());
        closed_within(tcp, left)
            .await
            .expect("a connection past the cap was left open while the cap was full");
    }
    let refused_at_once = refused_connections(&server);
    assert!(
        refused_at_once >= 200 - tolerable::server::PROBE_CONNECTIONS as u64,
        "only {refused_at_once} of 200 connections past the cap were refused"
    );
    // The probes' headroom frees up within its short timeout: /healthz gets through while the
    // cap is still full.
    let probe = healthz_answers_during_the_attack(server.addr, held_until).await;
    // A webhook request on such a connection takes the slot of the longest idle held one
    // (held[0], which only asked /healthz) instead of a 503 (issue 23): answered, here 400 for
    // a body that is not an AdmissionReview. (Retried while the probes' headroom is taken.)
    let response = mutate_on_a_new_connection(&server).await;
    let flood_lasted = started.elapsed();
    assert_eq!(response.status(), 400);
    // Closed before its idle timeout could close it: for the new one.
    closed_within(
        &mut held[0],
        held_until.saturating_duration_since(Instant::now()),
    )
    .await
    .expect("the longest idle connection was not closed for the new one");
    let metrics = tolerable::metrics::encode(&server.state.metrics_registry);
    assert!(
        metrics.contains("tolerable_connections_closed_total{reason=\"reclaimed\"} 1"),
        "{metrics}"
    );
    // The other connections within the cap still work.
    let tls = &mut held[1];
    tls.write_all(b"GET /readyz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tls.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // Those that got the probes' headroom were closed by its short timeout instead.
    let refused = refused_connections(&server);
    assert!(refused >= refused_at_once);
    eprintln!(
        "max_connections 20: 20 held, 200 more opened: {refused_at_once} refused at once, {refused} in all; /healthz answered in {probe:?}; {flood_lasted:?} in all"
    );
}

/// `tolerable_connections_refused_total`: connections closed at accept, past the cap.
fn refused_connections(server: &TestServer) -> u64 {
    let metrics = tolerable::metrics::encode(&server.state.metrics_registry);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("tolerable_connections_refused_total "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .parse()
        .unwrap()
}

/// `POST /mutate` with `{}` on a new connection, retried for 2 s while connections are
/// refused.
async fn mutate_on_a_new_connection(server: &TestServer) -> reqwest::Response {
    for _ in 0..20 {
        let sent = webhook::client()
            .post(server.url("/mutate"))
            .body("{}")
            .send()
            .await;
        match sent {
            Ok(answered) => return answered,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("no connection for /mutate");
}

/// The lock-out: under a hard limit of 1,024 open files, 1,012 idle connections made
/// `accept` fail for everyone, `/healthz` included. Now `max_connections` is lowered to fit, the
/// rest are closed at once, and the silent ones are closed after `request_read_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_past_the_open_files_limit_do_not_lock_out_healthz() {
    let served = Served::start_with_ulimit(
        "-n 1024",
        &[("TOLERABLE_SERVER__REQUEST_READ_TIMEOUT", "3s")],
    )
    .await;
    let baseline = served.rss_kib();
    let mut idle = Vec::new();
    for _ in 0..1100 {
        idle.push(TcpStream::connect(served.addr).await.unwrap());
    }
    // The last connection is accepted no sooner than its connect returned, so its read
    // timeout (3 s, set above) cannot end it before this: the attack holds the server until
    // then at least. (Mounting it takes this machine's time, which is not asserted.)
    let attack_ends = Instant::now() + Duration::from_secs(3);
    let probe = healthz_answers_during_the_attack(served.addr, attack_ends).await;
    let rss = served.rss_kib();
    let fds = std::fs::read_dir(format!("/proc/{}/fd", served.child.id()))
        .unwrap()
        .count();
    assert!(fds < 1024, "{fds} open files");
    // The silent connections are all closed (the limit only bounds a hung test), each by the
    // server: refused at accept, its slot taken back, or cut off by the read timeout — the
    // server counts every one.
    let mut open_after = 0;
    for tcp in &mut idle {
        let left = attack_ends.saturating_duration_since(Instant::now()) + IDLE_HANG_GUARD;
        if closed_within(tcp, left).await.is_none() {
            open_after += 1;
        }
    }
    assert_eq!(open_after, 0, "silent connections left open");
    let metrics = served_metrics(served.addr).await;
    let closed = metric(&metrics, "tolerable_connections_refused_total")
        + metric(
            &metrics,
            "tolerable_connections_closed_total{reason=\"idle\"}",
        )
        + metric(
            &metrics,
            "tolerable_connections_closed_total{reason=\"reclaimed\"}",
        );
    assert!(
        closed >= 1100.0,
        "{closed} closed by the server:\n{metrics}"
    );
    eprintln!(
        "open-files limit 1024, 1100 idle connections: /healthz answered in {probe:?}; server {fds} fds open, RSS {:.1} MiB (+{:.1} MiB); all closed, {closed} by the server",
        rss as f64 / 1024.0,
        rss.saturating_sub(baseline) as f64 / 1024.0
    );
}

/// A "registry" on 127.0.0.1 that accepts connections and never says a word: a lookup against
/// it stays in flight until its deadline. Counts the connections it accepted.
struct SilentRegistry {
    host: String,
    accepted: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl SilentRegistry {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let (count, accepted) = tokio::sync::watch::channel(0);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                held.push(tcp);
                count.send_replace(held.len());
            }
        });
        Self {
            host,
            accepted,
            task,
        }
    }

    /// Waits until it has accepted `n` connections.
    async fn accepted(&mut self, n: usize) {
        self.accepted.wait_for(|&seen| seen >= n).await.unwrap();
    }
}

impl Drop for SilentRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An AdmissionReview of a Pod whose one image is on `host`.
fn review_of_image_on(host: &str) -> serde_json::Value {
    webhook::recorded("pod-create-simple.v1.json", host)
}

/// Bodies being read take no in-flight permit (issue 23): the budgets and the read deadline
/// bound them. Admissions being answered do, and past the cap get a fast 503; the probes never
/// wait on the cap. "Fast" is an order of events, not a time: the 503 and the probe's answer
/// come while both admissions holding the permits are still in flight — held until the test
/// lets their registries go (their lookups could wait 20 s and more), whatever the machine's
/// speed.
#[tokio::test]
async fn requests_past_the_in_flight_cap_get_a_fast_503_and_probes_still_answer() {
    let server = TestServer::start_configured(held_admissions_config(), None).await;
    let mut stalled = stalled_bodies_hold_no_permit(&server).await;
    // Two admissions in flight: their lookups wait on registries that never answer.
    let mut registries = [SilentRegistry::start().await, SilentRegistry::start().await];
    let mut in_flight = Vec::new();
    for registry in &mut registries {
        let review = review_of_image_on(&registry.host);
        in_flight.push(tokio::spawn(webhook::admit_owned(
            server.url("/mutate?timeout=30s"),
            review,
        )));
        registry.accepted(1).await;
    }
    past_the_cap_a_503_without_waiting(&server, &in_flight).await;
    // The registries go away: the admissions are answered (allowed, with a warning), and
    // requests are taken again. The stalled bodies time out.
    drop(registries);
    for tls in &mut stalled {
        let response = closed_within(tls, Duration::from_secs(30)).await.unwrap();
        assert!(response.starts_with(b"HTTP/1.1 408"));
    }
    for admission in in_flight {
        let (status, response) = admission.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(response["response"]["allowed"], true, "{response}");
    }
    let response = webhook::client()
        .post(server.url("/mutate"))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
}

/// The test server with two in-flight permits, whose lookups may last as long as the API
/// server's longest timeout (30 s) allows: admissions waiting on a silent registry are held
/// until it goes away.
fn held_admissions_config() -> tolerable::config::Config {
    let mut config = tolerable::config::Config::load(None, Vec::new()).unwrap();
    config.policy = webhook::policy();
    config.server_limits = ServerLimits {
        max_requests_in_flight: 2,
        ..limits(Duration::from_secs(3), Duration::from_secs(30))
    };
    config.resolver.lookup_timeout = Duration::from_secs(30);
    config.read_pull_secrets = false;
    config.watch_nodes = false;
    config
}

/// Two requests whose bodies are stalled: they hold no permit, a third request is answered.
async fn stalled_bodies_hold_no_permit(server: &TestServer) -> Vec<TlsStream<TcpStream>> {
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut tls = connect(server.addr, b"http/1.1").await;
        tls.write_all(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000\r\n\r\n{")
            .await
            .unwrap();
        stalled.push(tls);
    }
    let response = webhook::client()
        .post(server.url("/mutate"))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "stalled bodies held the permits");
    stalled
}

/// With both permits held by admissions in flight, another gets a 503 at once (while they are
/// still in flight, whatever the machine's speed), and the probe does not wait on the cap.
async fn past_the_cap_a_503_without_waiting<T>(
    server: &TestServer,
    in_flight: &[tokio::task::JoinHandle<T>],
) {
    let started = Instant::now();
    let response = webhook::client()
        .post(server.url("/mutate"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("max_requests_in_flight"),
        "{body}"
    );
    // Fast means it did not wait for a permit: the admissions holding both are still in
    // flight (held until the test lets their registries go), whatever the speed.
    let still_in_flight = in_flight.iter().filter(|a| !a.is_finished()).count();
    assert_eq!(still_in_flight, 2, "the 503 came after {elapsed:?}");
    // The probe does not wait on the cap either: one GET, answered while both admissions are
    // still held (the kubelet's probe fails on its first unanswered try; its 1 s timeout is
    // the machine's speed, which this test does not measure).
    let probe = webhook::client_builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(probe.status(), 200);
    let still_in_flight = in_flight.iter().filter(|a| !a.is_finished()).count();
    assert_eq!(
        still_in_flight, 2,
        "/healthz answered only after an admission"
    );
    let metrics = tolerable::metrics::encode(&server.state.metrics_registry);
    assert_eq!(
        webhook::metric_value(
            &metrics,
            "tolerable_requests_refused_total{reason=\"requests_in_flight\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    // The server's own count agrees (the gauge is set when scraped): both admissions are
    // still being answered.
    let metrics = webhook::metrics_text(server).await;
    assert_eq!(
        webhook::metric_value(&metrics, "tolerable_requests_in_flight"),
        Some(2.0),
        "{metrics}"
    );
}

/// The connection the API server keeps open: HTTP/1.1 keep-alive over TLS, one request at a
/// time.
struct KeepAlive(hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>);

impl KeepAlive {
    async fn open(addr: SocketAddr) -> Self {
        let tls = connect(addr, b"http/1.1").await;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(connection);
        Self(sender)
    }

    /// Posts an AdmissionReview on this connection; the HTTP status.
    async fn admit(&mut self, review: &serde_json::Value) -> u16 {
        use http_body_util::BodyExt as _;
        self.0
            .ready()
            .await
            .expect("the open connection was closed");
        let request = http::Request::post("/mutate?timeout=10s")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from(review.to_string())))
            .unwrap();
        let response = self.0.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let _ = response.into_body().collect().await;
        status
    }
}

/// An admission answered at once: its image's registry refuses connections (allowed with a
/// warning).
fn quick_review() -> serde_json::Value {
    review_of_image_on("127.0.0.1:1")
}

/// A metric's value in a Prometheus text exposition, parsed as a number.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap_or_else(|e| panic!("{series}: {e}"))
}

/// Issue 23, item 4: connections sending a few bytes of a body and stalling no longer take the
/// in-flight permits: the API server's already-open connection gets no 503, and the stalled
/// bodies hold what they declared at most (the body gauge), all given back at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_do_not_lock_out_the_api_servers_open_connection() {
    let server = TestServer::start_with_limits(ServerLimits {
        max_requests_in_flight: 4,
        ..limits(Duration::from_secs(2), Duration::from_secs(30))
    })
    .await;
    let mut api_server = KeepAlive::open(server.addr).await;
    assert_eq!(api_server.admit(&quick_review()).await, 200);
    // Ten times the in-flight cap: 10 bytes of a 1,000-byte body each, then nothing.
    let mut stalled = Vec::new();
    for _ in 0..40 {
        let mut tls = connect(server.addr, b"http/1.1").await;
        tls.write_all(
            b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000\r\n\r\n{\"kind\":\"A",
        )
        .await
        .unwrap();
        stalled.push(tls);
    }
    // Every body is being read: each holds its declared 1,000 bytes of the budget.
    loop {
        let text = webhook::metrics_text(&server).await;
        if metric(&text, "tolerable_request_body_bytes") >= 40_000.0 {
            assert_eq!(metric(&text, "tolerable_request_body_bytes"), 40_000.0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(api_server.admit(&quick_review()).await);
    }
    assert_eq!(statuses, [200; 8], "the open connection's admissions");
    let (status, _) = webhook::admit_owned(server.url("/mutate?timeout=10s"), quick_review()).await;
    assert_eq!(status, 200, "a new connection's admission");
    // Each cut off with a 408 naming the read deadline configured here (2 s), before the idle
    // timeout (30 s, which bounds a hung test here) could have closed it.
    for tls in &mut stalled {
        let response = closed_within(tls, Duration::from_secs(30)).await.unwrap();
        let text = String::from_utf8_lossy(&response);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("within 2s (request_read_timeout)"), "{text}");
    }
    let text = webhook::metrics_text(&server).await;
    assert_eq!(metric(&text, "tolerable_request_body_bytes"), 0.0);
    assert_eq!(metric(&text, "tolerable_requests_in_flight"), 0.0);
    assert_eq!(
        metric(
            &text,
            "tolerable_requests_refused_total{reason=\"requests_in_flight\"}"
        ),
        0.0
    );
    assert_eq!(
        metric(
            &text,
            "tolerable_requests_refused_total{reason=\"read_timeout\"}"
        ),
        40.0
    );
}

/// Issue 23, item 6: keep-alive connections that asked `/healthz` once and idle fill every
/// slot; new connections' admissions take their slots, the longest idle first, and never the
/// slot of the API server's connection, which answered admissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_give_their_slots_to_new_admissions() {
    let server = TestServer::start_with_limits(ServerLimits {
        max_connections: 40,
        max_connections_per_peer: 40,
        ..limits(Duration::from_secs(2), Duration::from_secs(60))
    })
    .await;
    let mut api_server = KeepAlive::open(server.addr).await;
    assert_eq!(api_server.admit(&quick_review()).await, 200);
    // Each hoarder's idle timer starts after this.
    let hoarding = Instant::now();
    let mut hoarders = Vec::new();
    for _ in 0..39 {
        let mut tls = connect(server.addr, b"http/1.1").await;
        tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = tls.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        hoarders.push(tls);
    }
    // Every slot is held. Ten new connections, one admission each.
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let (status, _) =
            webhook::admit_owned(server.url("/mutate?timeout=10s"), quick_review()).await;
        statuses.push(status);
    }
    assert_eq!(statuses, [200; 10], "new connections' admissions");
    // Each took the slot of the longest idle hoarder, or one a previous new connection gave
    // back when it closed.
    let metrics = tolerable::metrics::encode(&server.state.metrics_registry);
    let reclaimed = metric(
        &metrics,
        "tolerable_connections_closed_total{reason=\"reclaimed\"}",
    ) as usize;
    assert!((1..=10).contains(&reclaimed), "{reclaimed} reclaimed");
    assert_eq!(
        metric(
            &metrics,
            "tolerable_requests_refused_total{reason=\"too_many_connections\"}"
        ),
        0.0
    );
    // Those were the longest idle hoarders, closed before their idle timeout (60 s, set above;
    // it bounds a hung test here) could have closed them; the others still answer; the API
    // server's connection kept its slot.
    for (i, tls) in hoarders.iter_mut().enumerate() {
        if i < reclaimed {
            let idle_timeout_at = hoarding + Duration::from_secs(60);
            closed_within(
                tls,
                idle_timeout_at.saturating_duration_since(Instant::now()),
            )
            .await
            .unwrap_or_else(|| panic!("hoarder {i} of {reclaimed} reclaimed left open"));
        } else {
            tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 1024];
            let n = tls.read(&mut buf).await.unwrap();
            assert!(
                buf[..n].starts_with(b"HTTP/1.1 200"),
                "hoarder {i} of {reclaimed} reclaimed"
            );
        }
    }
    for _ in 0..8 {
        assert_eq!(api_server.admit(&quick_review()).await, 200);
    }
}

/// A gzip bomb: an AdmissionReview whose one image is on `host`, padded with an annotation to
/// nearly 3 MiB, compressed to a few KB.
fn gzip_bomb(host: &str) -> Bytes {
    use std::io::Write as _;
    let mut review = review_of_image_on(host);
    let size = review.to_string().len();
    review["request"]["object"]["metadata"]["annotations"]["padding"] =
        serde_json::Value::String("a".repeat(MAX_BODY_BYTES - size - 4096));
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(review.to_string().as_bytes()).unwrap();
    let bomb = encoder.finish().unwrap();
    assert!(bomb.len() < 8 << 10, "{} bytes", bomb.len());
    bomb.into()
}

/// The served process's `/metrics` (on the webhook port: no metrics_addr).
async fn served_metrics(addr: SocketAddr) -> String {
    webhook::client()
        .get(format!("https://localhost:{}/metrics", addr.port()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Counts statuses; panics on anything but a 200 or a 503.
fn tally(statuses: impl IntoIterator<Item = u16>) -> (usize, usize) {
    statuses
        .into_iter()
        .fold((0, 0), |(ok, busy), status| match status {
            200 => (ok + 1, busy),
            503 => (ok, busy + 1),
            other => panic!("status {other}"),
        })
}

/// After an attack: nothing held, and the peak RSS within the bound.
async fn all_given_back(served: &Served, peak_kib: u64, attack: &str) {
    let text = served_metrics(served.addr).await;
    assert_eq!(
        metric(&text, "tolerable_request_body_bytes"),
        0.0,
        "{attack}"
    );
    assert_eq!(
        metric(&text, "tolerable_requests_in_flight"),
        0.0,
        "{attack}"
    );
    let peak_mib = peak_kib as f64 / 1024.0;
    eprintln!("{attack}: peak RSS {peak_mib:.1} MiB");
    assert!(peak_mib < 96.0, "{attack}: peak RSS {peak_mib:.1} MiB");
}

/// Issue 23, item 3: 20 connections each post a 3 KB gzip body that inflates to nearly 3 MiB,
/// kept in flight by a registry that never answers. The inflated bytes count against the
/// process's body budget (48 MiB: 16 such bodies), so the rest get a 503 and RSS stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bombs_on_many_connections_count_their_inflated_bytes() {
    let served = Served::start(&[]).await;
    let registry = SilentRegistry::start().await;
    let bomb = gzip_bomb(&registry.host);
    let (stop, peak) = served.sample_peak_rss();
    let url = format!(
        "https://localhost:{}/mutate?timeout=10s",
        served.addr.port()
    );
    let mut posts = Vec::new();
    for _ in 0..20 {
        let request = webhook::client()
            .post(&url)
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(bomb.clone());
        posts.push(tokio::spawn(async move {
            request.send().await.unwrap().status().as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for post in posts {
        statuses.push(post.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, busy) = tally(statuses);
    eprintln!("20 gzip bombs on 20 connections: {ok} answered, {busy} got 503");
    assert!(
        busy >= 4,
        "{ok} answered, {busy} refused: more than 16 held 3 MiB each"
    );
    let text = served_metrics(served.addr).await;
    assert_eq!(
        metric(
            &text,
            "tolerable_requests_refused_total{reason=\"body_memory\"}"
        ),
        busy as f64
    );
    all_given_back(
        &served,
        peak.join().unwrap(),
        "20 gzip bombs, 20 connections",
    )
    .await;
}

/// Issue 23, item 3: one h2 connection, 60 streams of gzip bombs: the connection's budget
/// (6 MiB) holds two inflated bodies at once; the others get a 503 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bombs_on_one_h2_connection_count_their_inflated_bytes() {
    let served = Served::start(&[]).await;
    let registry = SilentRegistry::start().await;
    let bomb = gzip_bomb(&registry.host);
    let (stop, peak) = served.sample_peak_rss();
    let tls = connect(served.addr, b"h2").await;
    let (mut client, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(connection);
    let mut streams = Vec::new();
    for _ in 0..60 {
        client = client.ready().await.unwrap();
        let request = http::Request::post("https://localhost/mutate?timeout=10s")
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(())
            .unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        body.send_data(bomb.clone(), true).unwrap();
        streams.push(tokio::spawn(async move {
            response.await.unwrap().status().as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for stream in streams {
        statuses.push(stream.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, busy) = tally(statuses);
    eprintln!("60 gzip bombs on one h2 connection: {ok} answered, {busy} got 503");
    assert!(busy >= 50, "{ok} answered, {busy} refused");
    all_given_back(
        &served,
        peak.join().unwrap(),
        "60 gzip bombs, one h2 connection",
    )
    .await;
}

/// The first bytes of a TLS ClientHello, never finished.
const PARTIAL_CLIENT_HELLO: &[u8] = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";

/// Connects to `addr` about `per_second` times a second until `stop`, each connection saying
/// nothing or a partial ClientHello and kept open (the newest `keep` of them), as a reconnect
/// flood does. Counts the connections made.
fn flood(
    addr: SocketAddr,
    per_second: u64,
    keep: usize,
    partial_hello: bool,
    stop: Arc<AtomicBool>,
    made: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut open = std::collections::VecDeque::new();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            for _ in 0..per_second / 100 {
                let Ok(mut tcp) = TcpStream::connect(addr).await else {
                    continue;
                };
                if partial_hello {
                    let _ = tcp.write_all(PARTIAL_CLIENT_HELLO).await;
                }
                open.push_back(tcp);
                if open.len() > keep {
                    open.pop_front();
                }
                made.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// Issue 23, item 5: a reconnect flood (raw TCP connects and partial ClientHellos, ~5,000 a
/// second, more than `max_connections_per_peer` kept open) only ever takes back its own pending
/// connections' slots: `/healthz` from a new connection is answered every time while the flood
/// goes on, and the API server's open connection gets no 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_flood_leaves_probes_and_the_api_servers_connection_answered() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut files = getrlimit(Resource::Nofile);
    files.current = files.maximum;
    let _ = setrlimit(Resource::Nofile, files);
    let served = Served::start(&[]).await;
    let mut api_server = KeepAlive::open(served.addr).await;
    assert_eq!(api_server.admit(&quick_review()).await, 200);
    let (sampling, peak) = served.sample_peak_rss();
    let (stop, made) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let flooders = [false, true].map(|partial_hello| {
        flood(
            served.addr,
            2500,
            700,
            partial_hello,
            stop.clone(),
            made.clone(),
        )
    });
    // The flood has filled the peer's share of the slots and goes on.
    while made.load(Ordering::Relaxed) < 3000 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Each probe, on a new connection, is answered 200 while the flood goes on: the flood runs
    // until the test stops it, so a probe locked out by it would never be answered (the 30 s
    // timeout is a hang guard). How soon (the kubelet waits 1 s) is the machine's speed, printed
    // below, not asserted (issue 29).
    let probe = webhook::client_builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("https://localhost:{}/healthz", served.addr.port());
    let (mut probes_answered, mut slowest) = (0, Duration::ZERO);
    let mut admissions = Vec::new();
    for _ in 0..20 {
        let asked = Instant::now();
        match probe.get(&url).send().await {
            Ok(response) if response.status() == 200 => probes_answered += 1,
            other => eprintln!("/healthz during the flood: {other:?}"),
        }
        slowest = slowest.max(asked.elapsed());
        admissions.push(api_server.admit(&quick_review()).await);
    }
    let flooded = made.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for flooder in flooders {
        flooder.await.unwrap();
    }
    let text = served_metrics(served.addr).await;
    let reclaimed = metric(
        &text,
        "tolerable_connections_closed_total{reason=\"reclaimed\"}",
    );
    let refused = metric(&text, "tolerable_connections_refused_total");
    eprintln!(
        "reconnect flood, {flooded} connections: /healthz answered {probes_answered} of 20 \
         (slowest in {slowest:?}); \
         {reclaimed} slots taken back, {refused} connections refused; admissions {admissions:?}"
    );
    assert_eq!(probes_answered, 20);
    assert_eq!(admissions, [200; 20], "the API server's open connection");
    assert!(reclaimed > 0.0, "the flood never reached the per-peer cap");
    sampling.store(true, Ordering::Relaxed);
    all_given_back(&served, peak.join().unwrap(), "reconnect flood").await;
}

/// Keeps `connections` HTTP/1.1 connections each declaring a 3 MiB body, sending `sent` bytes
/// of it and stalling — re-opened as soon as the server closes one (its 408 at the read
/// deadline, or a 503) — until `stop`. Counts the connections opened.
fn stalled_declared_bodies(
    addr: SocketAddr,
    connections: usize,
    sent: usize,
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicU64>, Vec<tokio::task::JoinHandle<()>>) {
    let opened = Arc::new(AtomicU64::new(0));
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {MAX_BODY_BYTES}\r\n\r\n"
    );
    let body = Bytes::from(vec![b' '; sent]);
    let tasks = (0..connections)
        .map(|_| {
            let (stop, opened, head, body) =
                (stop.clone(), opened.clone(), head.clone(), body.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let mut tls = connect(addr, b"http/1.1").await;
                    opened.fetch_add(1, Ordering::Relaxed);
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(&body).await;
                    let _ = tls.flush().await;
                    // Until the server closes it (or the test ends).
                    let mut buf = [0u8; 1024];
                    loop {
                        tokio::select! {
                            read = tls.read(&mut buf) => if !matches!(read, Ok(1..)) { break },
                            () = tokio::time::sleep(Duration::from_millis(200)) => {
                                if stop.load(Ordering::Relaxed) { return; }
                            }
                        }
                    }
                }
            })
        })
        .collect();
    (opened, tasks)
}

/// Issue 34, the A1 flood against the shipped defaults (one worker thread): 16, then 40
/// connections each declaring a 3 MiB body, sending 10 bytes and stalling, re-opened at each
/// 408 — and 16 that send all but one byte of it. Bodies are reserved as they arrive, one peer
/// holds at most its share, and the API server's open connection (it has had an admission
/// answered) draws on the reserve: it gets 200 on every admission, `/healthz` from a new
/// connection is answered while the flood runs, and the peak RSS stays within 96 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_declaring_3_mib_leave_the_api_servers_connection_answered() {
    let served = Served::start(&[]).await;
    let (sampling, peak) = served.sample_peak_rss();
    let mut api_server = KeepAlive::open(served.addr).await;
    assert_eq!(api_server.admit(&quick_review()).await, 200);
    for (connections, sent) in [(16, 10), (40, 10), (16, MAX_BODY_BYTES - 1)] {
        let stop = Arc::new(AtomicBool::new(false));
        let (opened, tasks) = stalled_declared_bodies(served.addr, connections, sent, stop.clone());
        while opened.load(Ordering::Relaxed) < connections as u64 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Every stalled body has arrived as far as it goes (the gauge holds at least 10 bytes
        // of each), so the admissions below meet the flood at its fullest.
        loop {
            let held = metric(
                &served_metrics(served.addr).await,
                "tolerable_request_body_bytes",
            );
            if held >= (connections * sent.min(16 << 10)) as f64 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut statuses = Vec::new();
        for _ in 0..14 {
            statuses.push(api_server.admit(&quick_review()).await);
        }
        // The flood re-opens its connections until `stop` is set below, after the probe: an
        // answer comes while it runs; the 30 s only keep a locked-out /healthz from hanging
        // the test.
        let flooding = Instant::now() + Duration::from_secs(30);
        let probe = healthz_answers_during_the_attack(served.addr, flooding).await;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.unwrap();
        }
        let flood = format!("{connections} connections sending {sent} bytes of 3 MiB");
        eprintln!("{flood}: API server's admissions {statuses:?}, /healthz in {probe:?}");
        assert_eq!(statuses, [200; 14], "{flood}");
    }
    sampling.store(true, Ordering::Relaxed);
    let text = served_metrics(served.addr).await;
    assert_eq!(
        metric(
            &text,
            "tolerable_body_refusals_total{peer_class=\"serving\",budget=\"process\"}"
        ),
        0.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "tolerable_body_refusals_total{peer_class=\"other\",budget=\"peer\"}"
        ) >= 1.0,
        "the flood that sent its bodies met its peer's share: {text}"
    );
    // The flood's connections were dropped by the client: their bodies are given back as the
    // server notices.
    for _ in 0..100 {
        let text = served_metrics(served.addr).await;
        if metric(&text, "tolerable_request_body_bytes") == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    all_given_back(&served, peak.join().unwrap(), "A1 stalled declared bodies").await;
}
