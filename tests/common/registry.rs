//! Real registries: Debian's `docker-registry` (CNCF distribution 2.8) on free 127.0.0.1 ports,
//! in-memory storage, one per auth mode, started once per test binary and stopped when the test
//! process exits (the wrapper shell kills it when its stdin, held by this process, closes).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::certs;
use super::fixtures;
use super::token::{self, TokenServer};

pub const USER: &str = "testuser";
pub const PASSWORD: &str = "testpass";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// http, no auth.
    Plain,
    /// https with the test CA, no auth.
    Tls,
    /// https, htpasswd Basic auth.
    Basic,
    /// https, Bearer tokens from [`TokenServer`].
    Token,
}

/// Requests for one repository, as the registry's access log shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    pub manifest_gets: usize,
    pub manifest_heads: usize,
    pub blob_gets: usize,
}

pub struct Registry {
    pub mode: Mode,
    /// `127.0.0.1:PORT`, as image references and `insecure_registries` name it.
    pub host: String,
    pub log_path: PathBuf,
    pub token: Option<TokenServer>,
    /// Set for a registry that can be killed and restarted with its images.
    config_path: Option<PathBuf>,
    _dir: tempfile::TempDir,
    _process: Mutex<Child>,
}

pub fn plain() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry::start_with_fixtures(Mode::Plain))
}

pub fn tls() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry::start_with_fixtures(Mode::Tls))
}

pub fn basic() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry::start_with_fixtures(Mode::Basic))
}

pub fn token() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry::start_with_fixtures(Mode::Token))
}

fn find_binary(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` not found: the registry tests need it. Install it with \
                 `sudo apt-get install -y {package}` (.ci/run does this)"
            )
        })
}

impl Registry {
    fn start_with_fixtures(mode: Mode) -> Self {
        super::init();
        let registry = Self::start(mode);
        let host = registry.host.clone();
        super::block_on_own_thread(async move {
            let pusher = fixtures::Pusher::for_mode(&host, mode);
            pusher.push_all("fixtures").await;
        });
        registry
    }

    pub fn start(mode: Mode) -> Self {
        Self::start_with_realm(mode, None)
    }

    /// Like [`Registry::start`]; in token mode, `realm` replaces the token service's URL.
    pub fn start_with_realm(mode: Mode, realm: Option<String>) -> Self {
        Self::start_with_storage(mode, realm, false)
    }

    /// A plain-http registry with the fixtures, storing them on disk so that it can be killed
    /// ([`Registry::stop`]) and started again ([`Registry::restart`]) on the same port.
    pub fn start_restartable() -> Self {
        super::init();
        let registry = Self::start_with_storage(Mode::Plain, None, true);
        let host = registry.host.clone();
        super::block_on_own_thread(async move {
            fixtures::Pusher::for_mode(&host, Mode::Plain)
                .push_all("fixtures")
                .await;
        });
        registry
    }

    fn start_with_storage(mode: Mode, realm: Option<String>, on_disk: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = super::free_port();
        let host = format!("127.0.0.1:{port}");
        let mut tls = String::new();
        if mode != Mode::Plain {
            let leaf = certs::ca().leaf(&["127.0.0.1", "localhost"]);
            write(dir.path(), "registry.crt", &leaf.cert_pem);
            write(dir.path(), "registry.key", &leaf.key_pem);
            tls = format!(
                "  tls:\n    certificate: {0}/registry.crt\n    key: {0}/registry.key\n",
                dir.path().display()
            );
        }
        let mut token_server = None;
        let auth = match mode {
            Mode::Plain | Mode::Tls => String::new(),
            Mode::Basic => {
                let htpasswd = find_binary("htpasswd", "apache2-utils");
                let out = Command::new(htpasswd)
                    .args(["-Bbn", USER, PASSWORD])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "htpasswd failed");
                std::fs::write(dir.path().join("htpasswd"), out.stdout).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: tolerable-test\n    path: {}/htpasswd\n",
                    dir.path().display()
                )
            }
            Mode::Token => {
                let server = TokenServer::start();
                write(dir.path(), "token.crt", &server.cert_pem);
                let auth = format!(
                    "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}/token.crt\n",
                    realm.unwrap_or_else(|| server.realm()),
                    token::SERVICE,
                    token::ISSUER,
                    dir.path().display()
                );
                token_server = Some(server);
                auth
            }
        };
        let storage = if on_disk {
            format!(
                "filesystem:\n    rootdirectory: {}/storage",
                dir.path().display()
            )
        } else {
            "inmemory: {}".to_owned()
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  {storage}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: {host}\n  secret: tolerable-test-only\n{tls}{auth}"
        );
        let config_path = write(dir.path(), "config.yml", &config);
        let log_path = dir.path().join("registry.log");
        // A restartable registry's directory outlives each process; the others clean up after
        // themselves even when the test binary dies.
        let process = spawn(
            &config_path,
            &log_path,
            (!on_disk).then(|| dir.path()),
            &host,
        );
        Self {
            mode,
            host,
            log_path,
            token: token_server,
            config_path: on_disk.then_some(config_path),
            _dir: dir,
            _process: Mutex::new(process),
        }
    }

    /// Starts a stopped restartable registry again, on the same port with the same images.
    pub fn restart(&self) {
        let config = self
            .config_path
            .as_ref()
            .expect("only a restartable registry restarts");
        let mut process = self._process.lock().unwrap();
        assert!(
            process.try_wait().unwrap().is_some(),
            "restart: the registry is still running"
        );
        *process = spawn(config, &self.log_path, None, &self.host);
    }

    /// `127.0.0.1:PORT` of the token service (token mode only).
    pub fn token_host(&self) -> String {
        format!(
            "127.0.0.1:{}",
            self.token.as_ref().expect("not a token registry").port
        )
    }

    pub fn url(&self) -> String {
        let scheme = if self.mode == Mode::Plain {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{}", self.host)
    }

    /// The registry's access log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Registry requests for `repository` made by tolerable (by its User-Agent), as
    /// (manifest requests, blob requests). Waits for the access log to catch up by sending a
    /// marker request and waiting until it is logged.
    pub async fn requests_for(&self, repository: &str) -> (usize, usize) {
        let counts = self.requests_by_method(repository).await;
        (
            counts.manifest_gets + counts.manifest_heads,
            counts.blob_gets,
        )
    }

    /// Registry requests for `repository` made by tolerable, by method, from the registry's
    /// own access log (after it has caught up, as [`Registry::requests_for`]).
    pub async fn requests_by_method(&self, repository: &str) -> Requests {
        let marker = format!("marker-{}", super::free_port());
        let _ = fixtures::Pusher::for_mode(&self.host, self.mode)
            .probe(repository, &marker)
            .await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.log().contains(&marker) {
            assert!(
                Instant::now() < deadline,
                "marker never reached the access log"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let log = self.log();
        let ours = log
            .lines()
            .filter(|l| l.contains("\"tolerable/") && !l.contains(&marker));
        let mut counts = Requests::default();
        for line in ours {
            let (manifest, blob) = (
                format!(" /v2/{repository}/manifests/"),
                format!(" /v2/{repository}/blobs/"),
            );
            let count = if line.contains(&format!("\"GET{manifest}")) {
                &mut counts.manifest_gets
            } else if line.contains(&format!("\"HEAD{manifest}")) {
                &mut counts.manifest_heads
            } else if line.contains(&format!("\"GET{blob}")) {
                &mut counts.blob_gets
            } else {
                continue;
            };
            *count += 1;
        }
        counts
    }

    /// Stops the registry process (the shell wrapper kills it when stdin closes).
    pub fn stop(&self) {
        let mut process = self._process.lock().unwrap();
        if let Some(mut stdin) = process.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = process.wait();
    }
}

/// Runs `docker-registry serve CONFIG` under a shell that kills it when stdin closes (so it dies
/// with the test binary) and then removes `cleanup`; waits until it accepts connections.
fn spawn(config: &Path, log: &Path, cleanup: Option<&Path>, host: &str) -> Child {
    let binary = find_binary("docker-registry", "docker-registry");
    let mut process = Command::new("sh")
        .arg("-c")
        .arg(r#""$0" serve "$1" >> "$2" 2>&1 & pid=$!; read _; kill $pid 2>/dev/null; wait $pid 2>/dev/null; [ -n "$3" ] && rm -rf "$3""#)
        .arg(&binary)
        .arg(config)
        .arg(log)
        .arg(cleanup.map(Path::as_os_str).unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while std::net::TcpStream::connect(host).is_err() {
        if started.elapsed() > Duration::from_secs(15) || process.try_wait().unwrap().is_some() {
            panic!(
                "registry did not start: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    process
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}
