//! `tolerable serve` as its own process (the release binary the benchmarks measure): its
//! certificate, its command line, and the CPU and memory figures read from `/proc`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};

/// A running `tolerable serve`, killed when dropped.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
    /// Its working directory (certificate and key).
    pub dir: tempfile::TempDir,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A working directory with a serving certificate for `localhost` and `127.0.0.1` from the
/// test CA (`tls.crt`, `tls.key`), and a free address on 127.0.0.1.
pub fn prepare() -> (tempfile::TempDir, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let leaf = super::certs::ca().leaf(&["localhost", "127.0.0.1"]);
    std::fs::write(dir.path().join("tls.crt"), &leaf.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &leaf.key_pem).unwrap();
    let addr = format!("127.0.0.1:{}", super::free_port()).parse().unwrap();
    (dir, addr)
}

/// The `tolerable` a bench measures: this build's, or the build `BENCH_SERVER_BINARY` names (an
/// earlier commit's, or the image's static musl binary: `make bench-shipped`).
pub fn server_binary() -> String {
    std::env::var("BENCH_SERVER_BINARY")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tolerable").to_owned())
}

/// `program` (the binary, or a wrapper that runs it) as `tolerable serve` in `dir` on `addr`
/// with its certificate, and nothing else from this process's environment.
pub fn serve_command(
    program: impl AsRef<std::ffi::OsStr>,
    dir: &Path,
    addr: SocketAddr,
) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("TOLERABLE_SERVER__LISTEN_ADDR", addr.to_string())
        .env("TOLERABLE_TLS__CERT_PATH", dir.join("tls.crt"))
        .env("TOLERABLE_TLS__KEY_PATH", dir.join("tls.key"))
        .current_dir(dir);
    command
}

/// A process's CPU time (user + system) in microseconds, from `/proc/PID/stat`.
pub fn cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks * 1_000_000 / 100 // USER_HZ is 100 on Linux
}

/// A `/proc/PID/status` figure (`VmRSS:`, `VmHWM:`) in MiB.
pub fn status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix(" kB")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap()
        / 1024.0
}
