//! A real Redis: Debian's `redis-server` on a free 127.0.0.1 port, no persistence, one per test.
//! It can be killed by its PID (an outage), frozen (SIGSTOP: a cache that accepts connections
//! and never answers) and started again on the same port, empty. It can also speak TLS only
//! (`rediss://`), with a certificate for 127.0.0.1 from the test CA (Debian builds it with TLS).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tolerable::registry::SharedCacheSettings;

pub struct RedisServer {
    pub port: u16,
    password: Option<String>,
    /// Set for a TLS-only server: the CA its certificate chains to (PEM).
    tls_ca: Option<String>,
    /// The shell wrapper (which kills redis when its stdin closes) and redis' own PID.
    process: Mutex<Option<(Child, u32)>>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with_password(None)
    }

    /// A Redis that asks clients for `password` (`requirepass`).
    pub fn start_with_password(password: Option<&str>) -> Self {
        Self::start_with(password, false)
    }

    /// A Redis that speaks only TLS (`--port 0 --tls-port`), its certificate for 127.0.0.1
    /// from the test CA ([`super::certs::ca`]); clients need no certificate. With `password`,
    /// it asks for it (`requirepass`).
    pub fn start_tls(password: Option<&str>) -> Self {
        Self::start_with(password, true)
    }

    fn start_with(password: Option<&str>, tls: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tls_ca = tls.then(|| {
            let ca = super::certs::ca();
            let leaf = ca.leaf(&["127.0.0.1"]);
            std::fs::write(dir.path().join("tls.crt"), &leaf.cert_pem).unwrap();
            std::fs::write(dir.path().join("tls.key"), &leaf.key_pem).unwrap();
            std::fs::write(dir.path().join("ca.crt"), &ca.ca_pem).unwrap();
            ca.ca_pem.clone()
        });
        let server = Self {
            port: super::free_port(),
            password: password.map(str::to_owned),
            tls_ca,
            process: Mutex::new(None),
            dir,
        };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:PORT/0` (`rediss://` for a TLS server), without the password.
    pub fn url(&self) -> String {
        let scheme = if self.tls_ca.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    /// Settings for tolerable's shared cache on this server (trusting the test CA for TLS).
    pub fn settings(&self) -> SharedCacheSettings {
        self.settings_trusting(self.tls_ca.as_deref())
    }

    /// Settings that trust `ca_pem` (`cache_ca_path`), or the system's roots for `None`.
    pub fn settings_trusting(&self, ca_pem: Option<&str>) -> SharedCacheSettings {
        let ca_pem = ca_pem.map(|pem| pem.as_bytes().to_vec());
        SharedCacheSettings::new(&self.url(), self.password.clone(), ca_pem).unwrap()
    }

    /// The arguments of `redis-server`: this port, loopback, nothing on disk.
    fn args(&self) -> Vec<String> {
        let dir = self.dir.path();
        let port = self.port.to_string();
        let mut args: Vec<String> = match self.tls_ca {
            None => vec!["--port".into(), port],
            Some(_) => [
                ("--port", "0".to_owned()),
                ("--tls-port", port),
                ("--tls-cert-file", dir.join("tls.crt").display().to_string()),
                ("--tls-key-file", dir.join("tls.key").display().to_string()),
                (
                    "--tls-ca-cert-file",
                    dir.join("ca.crt").display().to_string(),
                ),
                ("--tls-auth-clients", "no".to_owned()),
            ]
            .into_iter()
            .flat_map(|(flag, value)| [flag.to_owned(), value])
            .collect(),
        };
        args.extend(
            [
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ]
            .map(str::to_owned),
        );
        args.push(dir.display().to_string());
        if let Some(password) = &self.password {
            args.extend(["--requirepass".to_owned(), password.clone()]);
        }
        args
    }

    fn spawn(&self) {
        let binary = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join("redis-server"))
            .find(|p| p.is_file())
            .expect(
                "`redis-server` not found: the shared-cache tests need it. Install it with \
                 `sudo apt-get install -y redis-server` (scripts/install-test-deps.sh does this)",
            );
        let args = self.args();
        // The wrapper prints redis' PID, and kills it when this process closes its stdin (so
        // it dies with the test binary).
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(r#""$0" "$@" > "$LOG" 2>&1 & pid=$!; echo $pid; read _; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null"#)
            .arg(binary)
            .args(&args)
            .env("LOG", self.dir.path().join("redis.log"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(shell.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid: u32 = line.trim().parse().expect("the wrapper prints the PID");
        *self.process.lock().unwrap() = Some((shell, pid));
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start: {}",
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal(&self, signal: &str) {
        let process = self.process.lock().unwrap();
        let (_, pid) = process.as_ref().expect("redis is running");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Kills redis by its PID (SIGKILL: no goodbye to clients), and waits until it is gone.
    pub fn kill(&self) {
        self.signal("-KILL");
        let (mut shell, _) = self.process.lock().unwrap().take().unwrap();
        drop(shell.stdin.take());
        let _ = shell.wait();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a killed redis again on the same port (empty: it keeps nothing on disk).
    pub fn restart(&self) {
        assert!(self.process.lock().unwrap().is_none(), "still running");
        self.spawn();
    }

    /// Freezes redis (SIGSTOP): connections are accepted by the kernel, nothing is answered.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// The keys stored now (`KEYS *`, over a raw connection: not for a TLS server).
    pub fn keys(&self) -> Vec<String> {
        assert!(self.tls_ca.is_none(), "keys() speaks plain RESP, not TLS");
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        if let Some(password) = &self.password {
            write!(stream, "AUTH {password}\r\n").unwrap();
        }
        stream.write_all(b"KEYS *\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        if self.password.is_some() {
            reader.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "+OK", "AUTH");
            line.clear();
        }
        reader.read_line(&mut line).unwrap();
        let count: usize = line.trim().trim_start_matches('*').parse().unwrap();
        let mut keys = Vec::new();
        for _ in 0..count {
            line.clear();
            reader.read_line(&mut line).unwrap(); // $len
            line.clear();
            reader.read_line(&mut line).unwrap();
            keys.push(line.trim_end().to_owned());
        }
        keys.sort();
        keys
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some((mut shell, pid)) = self.process.lock().unwrap().take() {
            let _ = Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
            drop(shell.stdin.take());
            let _ = shell.wait();
        }
    }
}
