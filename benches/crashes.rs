//! The crash watch's cost at scale (`cargo bench --bench crashes`, or `make bench`): the
//! release binary `tolerable serve` with `[crashes] watch` (leading: it holds the Lease alone)
//! against a fake API server (`tests/common/crash_scale_api.rs`, derived from the recorded
//! crash by name and uid substitution) where `BENCH_PODS` (10,000) Pods crash-loop for other
//! reasons than the architecture — OOM kills, exit 1 without a message, exit 1 with a
//! configuration error — each with a kubelet BackOff Event, listed (pages of 500), every one
//! sent again on the watch at once (the kubelets' next BackOffs), then `BENCH_BACKOFFS_PER_SECOND`
//! a second (default: the Pods / 300 — each Pod at the kubelet's longest back-off, 5 minutes).
//!
//! Measured over `BENCH_SECONDS` (30) after the watch opened: the Pod reads and log reads the
//! watch made (bounded by `LOOKS_PER_SECOND` = 20 and the fair queue of 64, whatever the number of
//! Pods), the server's CPU (user + system, `/proc/PID/stat`) from its start and over the
//! window, its RSS and peak RSS; the same server with the watch off beside it for the memory.
//! Prints a Markdown table; method and results in BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::crash_scale_api::CrashScaleApi;
use common::process::{cpu_us, status_mib, ServerProcess};

/// The crash watch's pace (`crashes::LOOKS_PER_SECOND`).
const LOOKS_PER_SECOND: f64 = 20.0;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `tolerable serve` as shipped but for what this fake does not serve (no node or namespace
/// watch, no pull secrets), one worker thread, `[crashes] watch` as `watch` says.
fn spawn(kubeconfig: &std::path::Path, watch: bool) -> ServerProcess {
    let (dir, addr) = common::process::prepare();
    let child = common::process::serve_command(env!("CARGO_BIN_EXE_tolerable"), dir.path(), addr)
        .arg("serve")
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAMESPACE", "tolerable-system")
        .env("HOSTNAME", "bench-replica")
        .env("TOLERABLE_SERVER__WORKER_THREADS", "1")
        .env("TOLERABLE_NODES__WATCH", "false")
        .env("TOLERABLE_POLICY__NAMESPACE_POLICY", "false")
        .env("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false")
        .env("TOLERABLE_CRASHES__WATCH", watch.to_string())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
        .spawn()
        .unwrap();
    ServerProcess { child, addr, dir }
}

/// Waits (at most 120 s, a hung run's guard) until `done`; else fails with `server`'s log.
fn until(server: &ServerProcess, what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > Duration::from_secs(120) {
            let log = std::fs::read_to_string(server.dir.path().join("stderr.log"));
            panic!(
                "never {what}; the server's log:\n{}",
                log.unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    let pods = env_number("BENCH_PODS", 10_000) as usize;
    let seconds = env_number("BENCH_SECONDS", 30);
    // Each Pod at the kubelet's longest back-off (5 minutes) backs off again every 5 minutes.
    let backoffs = env_number("BENCH_BACKOFFS_PER_SECOND", (pods as u64).div_ceil(300));
    let api = CrashScaleApi::start(pods, backoffs);
    let kubeconfig = api.kubeconfig();
    let spawned = Instant::now();
    let server = spawn(kubeconfig.path(), true);
    let pid = server.child.id();
    until(&server, "watching", || api.counts().watches >= 1);
    let (opened, cpu_open) = (api.counts(), cpu_us(pid));
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let (after, cpu_after, window) = (api.counts(), cpu_us(pid), started.elapsed());
    let lived = spawned.elapsed().as_secs_f64();
    let (rss, peak) = (status_mib(pid, "VmRSS:"), status_mib(pid, "VmHWM:"));
    let off = spawn(kubeconfig.path(), false);
    std::thread::sleep(Duration::from_secs(5));
    let rss_off = status_mib(off.child.id(), "VmRSS:");
    let secs = window.as_secs_f64();
    let reads = after.pod_reads - opened.pod_reads;
    let logs = after.log_reads - opened.log_reads;
    println!("| {pods} Pods crash-looping (OOM, exit 1, config errors) | |");
    println!("| --- | --- |");
    println!(
        "| list | {} pages; to the watch: {} Pod reads, {} log reads, {:.0} ms CPU from start |",
        opened.lists,
        opened.pod_reads,
        opened.log_reads,
        cpu_open as f64 / 1000.0
    );
    println!(
        "| {secs:.0} s from the watch: {pods} BackOffs at once, then {backoffs}/s | {reads} Pod reads ({:.2}/s), {logs} log reads ({:.2}/s) |",
        reads as f64 / secs,
        logs as f64 / secs
    );
    println!(
        "| server CPU in that window | {:.1} ms ({:.2}% of a core) |",
        (cpu_after - cpu_open) as f64 / 1000.0,
        (cpu_after - cpu_open) as f64 / 1e4 / secs
    );
    println!("| RSS | {rss:.1} MiB (peak {peak:.1} MiB); watch off: {rss_off:.1} MiB |");
    println!(
        "| requests not served (Events, patches, deletes) | {} |",
        after.unserved
    );
    // The pace bounds the reads over the server's life, whatever the number of Pods (the
    // first look needs no tick).
    assert!(
        (after.pod_reads as f64) <= LOOKS_PER_SECOND * lived + 1.0,
        "{after:?} in {lived:.1} s"
    );
    assert!(after.log_reads <= after.pod_reads, "{after:?}");
    assert_eq!(after.unserved, 0, "{after:?}");
}
