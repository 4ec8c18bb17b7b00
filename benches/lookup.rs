//! Lookup benchmarks (`cargo bench --bench lookup`, or `make bench`): a real registry on
//! loopback, the real resolver.
//!
//! - warm: a cached lookup (parse the reference, hash the key, hit the cache).
//! - cold: an uncached lookup of an OCI index, against the registry's own time for the same
//!   manifest GET over a raw keep-alive connection.
//!
//! Results and method go in BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::registry::{self, Mode};
use tolerable::registry::{CredentialStore, Resolver};

const ACCEPT: &str =
    "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
                      application/vnd.docker.distribution.manifest.list.v2+json, \
                      application/vnd.docker.distribution.manifest.v2+json";

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn fmt(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// One manifest GET over an open keep-alive connection: the registry's own time plus loopback.
fn raw_get(stream: &mut BufReader<TcpStream>, host: &str, path: &str) {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: {ACCEPT}\r\nUser-Agent: bench-raw\r\n\r\n"
    );
    stream.get_mut().write_all(request.as_bytes()).unwrap();
    let mut length = 0usize;
    let mut line = String::new();
    let mut status_ok = false;
    loop {
        line.clear();
        stream.read_line(&mut line).unwrap();
        if line.starts_with("HTTP/1.1 200") {
            status_ok = true;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        if line == "\r\n" {
            break;
        }
    }
    assert!(status_ok, "raw GET {path} failed");
    let mut body = vec![0; length];
    stream.read_exact(&mut body).unwrap();
}

fn main() {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let registry = registry::plain();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    println!("| benchmark | result |");
    println!("| --- | --- |");

    if filter.as_deref().is_none_or(|f| "warm".contains(f)) {
        warm_lookup(&runtime, &registry.host);
    }
    if filter.as_deref().is_none_or(|f| "cold".contains(f)) {
        cold_lookup(&runtime, &registry.host);
    }
}

/// A cached lookup: warm-up, then batches; reports the median batch's per-lookup time.
fn warm_lookup(runtime: &tokio::runtime::Runtime, host: &str) {
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    let image = format!("{host}/fixtures/multiarch-oci:v1");
    runtime.block_on(async {
        resolver.resolve(&image).await.unwrap();
        let mut per_lookup = Vec::new();
        for _ in 0..30 {
            const N: u32 = 20_000;
            let started = Instant::now();
            for _ in 0..N {
                std::hint::black_box(
                    resolver
                        .resolve(std::hint::black_box(&image))
                        .await
                        .unwrap(),
                );
            }
            per_lookup.push(started.elapsed() / N);
        }
        println!(
            "| warm lookup (median of 30 × 20,000) | {} |",
            fmt(percentile(&mut per_lookup, 0.5))
        );
    });
}

/// Distinct tags of one index, so every cold lookup is a cache miss for one manifest GET.
const COLD_TAGS: usize = 300;

/// Uncached lookups of an index, against the registry's own time for the same GETs.
fn cold_lookup(runtime: &tokio::runtime::Runtime, host: &str) {
    let digest = push_cold_tags(runtime, host);
    let mut raw = raw_manifest_gets(host);
    let mut cold = cold_lookups(runtime, host, &digest);
    let raw_p50 = percentile(&mut raw, 0.5);
    let cold_p50 = percentile(&mut cold, 0.5);
    println!(
        "| registry's own manifest GET, raw keep-alive (p50 of {COLD_TAGS}) | {} |",
        fmt(raw_p50)
    );
    println!(
        "| cold index lookup through tolerable (p50 of {COLD_TAGS}) | {} |",
        fmt(cold_p50)
    );
    println!(
        "| cold index lookup (p90 of {COLD_TAGS}) | {} |",
        fmt(percentile(&mut cold, 0.9))
    );
    println!(
        "| cold lookup above the registry's own time (p50) | {} |",
        fmt(cold_p50.saturating_sub(raw_p50))
    );
}

/// Pushes the multi-arch fixture to `bench/cold` and its index as tags `t0`..; returns the
/// index's digest.
fn push_cold_tags(runtime: &tokio::runtime::Runtime, host: &str) -> String {
    let pusher = common::fixtures::Pusher::for_mode(host, Mode::Plain);
    let digest = runtime.block_on(pusher.push("bench/cold", "multiarch-oci", "v1"));
    let index = runtime.block_on(async {
        let client = oci_client::Client::try_from(oci_client::client::ClientConfig {
            protocol: oci_client::client::ClientProtocol::Http,
            ..Default::default()
        })
        .unwrap();
        let reference = oci_client::Reference::with_digest(
            host.to_owned(),
            "bench/cold".into(),
            digest.clone(),
        );
        let (body, _) = client
            .pull_manifest_raw(
                &reference,
                &oci_client::secrets::RegistryAuth::Anonymous,
                &[common::fixtures::OCI_INDEX],
            )
            .await
            .unwrap();
        body
    });
    runtime.block_on(common::fixtures::push_index_tags(
        host,
        "bench/cold",
        &index,
        0..COLD_TAGS,
        1,
    ));
    digest
}

/// The time of each tag's manifest GET over one raw keep-alive connection, timed in the second
/// of two rounds (the first is warm-up).
fn raw_manifest_gets(host: &str) -> Vec<Duration> {
    let mut raw = Vec::new();
    let connection = TcpStream::connect(host).unwrap();
    connection.set_nodelay(true).unwrap();
    let mut stream = BufReader::new(connection);
    for round in 0..2 {
        for i in 0..COLD_TAGS {
            let started = Instant::now();
            raw_get(&mut stream, host, &format!("/v2/bench/cold/manifests/t{i}"));
            if round == 1 {
                raw.push(started.elapsed());
            }
        }
    }
    raw
}

/// The time of each tag's lookup through a fresh resolver, after one untimed lookup of the
/// index by digest.
fn cold_lookups(runtime: &tokio::runtime::Runtime, host: &str, digest: &str) -> Vec<Duration> {
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    let mut cold = Vec::new();
    runtime.block_on(async {
        resolver
            .resolve(&format!("{host}/bench/cold@{digest}"))
            .await
            .unwrap();
        for i in 0..COLD_TAGS {
            let image = format!("{host}/bench/cold:t{i}");
            let started = Instant::now();
            resolver.resolve(&image).await.unwrap();
            cold.push(started.elapsed());
        }
    });
    cold
}
