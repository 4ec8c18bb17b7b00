//! The webhook server, started in-process on 127.0.0.1 with certificates laid out the way the
//! kubelet mounts a Secret (`..data` symlink), and a client that trusts the test CA.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tolerable::app::{Leadership, Webhook};
use tolerable::mutate::Policy;
use tolerable::registry::ResolverSettings;
use tolerable::server::{AppState, ServerLimits};

use super::certs;

pub fn policy() -> Policy {
    // The defaults, with a second tainted pool.
    Policy {
        supported_architectures: BTreeSet::from(["arm64".to_owned(), "s390x".to_owned()]),
        ..Policy::default()
    }
}

/// A Secret volume as the kubelet writes it: `tls.crt -> ..data/tls.crt`,
/// `..data -> ..<timestamp>/`. [`SecretVolume::rotate`] swaps `..data` atomically.
pub struct SecretVolume {
    pub dir: tempfile::TempDir,
    generation: usize,
}

impl SecretVolume {
    pub fn new(cert_pem: &str, key_pem: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut volume = Self { dir, generation: 0 };
        volume.write_generation(cert_pem, key_pem);
        std::os::unix::fs::symlink(
            volume.generation_dir_name(),
            volume.dir.path().join("..data"),
        )
        .unwrap();
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.dir.path().join(name))
                .unwrap();
        }
        volume
    }

    fn generation_dir_name(&self) -> String {
        format!(
            "..2026_11_22_00_00_{:02}.{}",
            self.generation,
            1000 + self.generation
        )
    }

    fn write_generation(&mut self, cert_pem: &str, key_pem: &str) {
        let dir = self.dir.path().join(self.generation_dir_name());
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), key_pem).unwrap();
    }

    /// The kubelet's atomic update: write a new timestamped directory, point a temporary
    /// symlink at it, rename it over `..data`, remove the old directory.
    pub fn rotate(&mut self, cert_pem: &str, key_pem: &str) {
        let old = self.dir.path().join(self.generation_dir_name());
        self.generation += 1;
        self.write_generation(cert_pem, key_pem);
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(self.generation_dir_name(), &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
        std::fs::remove_dir_all(old).unwrap();
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }
}

/// The webhook's policy with the default resolver settings: no test registry is started.
fn webhook_settings() -> (Policy, ResolverSettings) {
    let defaults = tolerable::config::Config::load(None, Vec::new()).unwrap();
    (policy(), defaults.resolver)
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    /// The node watch, when the server reads a cluster.
    pub nodes: Option<tolerable::cluster::nodes::NodeWatch>,
    /// The namespace watch, when the config reads per-namespace policy from a cluster.
    pub namespaces: Option<tolerable::cluster::namespaces::NamespacePolicies>,
    pub volume: SecretVolume,
    /// Whether it leads the gate releasers, when it competes ([`TestServer::start_electing`]).
    pub leader: Option<tokio::sync::watch::Receiver<bool>>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// The engine `tolerable serve` would build from the default config with `policy` and the test
/// resolver `settings` (no metrics), reading what `sources` gives: for tests that answer
/// AdmissionReviews in process, through the one constructor the product uses.
pub fn engine(
    policy: Policy,
    settings: ResolverSettings,
    sources: tolerable::engine::Sources,
) -> tolerable::engine::Engine {
    let mut config = tolerable::config::Config::load(None, Vec::new()).unwrap();
    config.policy = policy;
    config.resolver = settings;
    tolerable::engine::Engine::build(&config, tolerable::engine::Purpose::Admit, sources).unwrap()
}

impl TestServer {
    pub async fn start(policy: Policy, settings: ResolverSettings) -> Self {
        Self::start_with((policy, settings), None, ServerLimits::default()).await
    }

    /// A server with these connection and request limits.
    pub async fn start_with_limits(limits: ServerLimits) -> Self {
        Self::start_with(webhook_settings(), None, limits).await
    }

    /// A server that reads the cluster behind `kube` (a fake API server): it decides with (and
    /// is not ready before) the node watch; its `nodes` is that watch.
    pub async fn start_with_cluster(
        policy: Policy,
        settings: ResolverSettings,
        kube: kube::Client,
    ) -> Self {
        Self::start_with((policy, settings), Some(kube), ServerLimits::default()).await
    }

    /// The server as `tolerable serve` builds it (the same composition root), from the default
    /// config with these parts replaced, on 127.0.0.1 with the test CA's certificate.
    async fn start_with(
        (policy, settings): (Policy, ResolverSettings),
        kube: Option<kube::Client>,
        limits: ServerLimits,
    ) -> Self {
        let mut config = tolerable::config::Config::load(None, Vec::new()).unwrap();
        config.policy = policy;
        config.resolver = settings;
        config.server_limits = limits;
        // The fake API server serves nodes; pull secrets and namespace policy have their own
        // tests.
        config.read_pull_secrets = false;
        config.namespace_policy = false;
        config.watch_nodes = kube.is_some();
        Self::start_configured(config, kube).await
    }

    /// The server `config` describes (its policy, resolver, credentials and credential
    /// plugins), on 127.0.0.1 with the test CA's certificate, `/metrics` on the webhook port.
    /// It does not compete for the Lease (most fakes serve none): what only a leader does (the
    /// gate releaser, the crash watch) it always does, as a replica that need not elect.
    pub async fn start_configured(
        config: tolerable::config::Config,
        kube: Option<kube::Client>,
    ) -> Self {
        Self::start_led(config, kube, Leadership::alone()).await
    }

    /// [`TestServer::start_configured`], competing for the Lease as `serve` decides from
    /// `config` ([`Leadership::of_replica`]: where it gates, with a cluster).
    pub async fn start_as_serve(
        config: tolerable::config::Config,
        kube: Option<kube::Client>,
    ) -> Self {
        let leadership = Leadership::of_replica(&config, kube.as_ref());
        Self::start_led(config, kube, leadership).await
    }

    /// [`TestServer::start_configured`], competing for the gate releasers' Lease as `election`
    /// says, as `serve` does when it gates.
    pub async fn start_electing(
        config: tolerable::config::Config,
        kube: Option<kube::Client>,
        election: tolerable::cluster::lease::LeaderElectionSettings,
    ) -> Self {
        Self::start_led(config, kube, Leadership::compete(election)).await
    }

    /// [`TestServer::start_configured`] as a replica that does not lead: another replica (the
    /// returned election, identity `holder`) takes the Lease first through `kube` and keeps
    /// it while it lives; this one competes (identity `follower`) through the same API, whose
    /// fake must serve Leases (`lease_api::Leases`).
    pub async fn start_following(
        config: tolerable::config::Config,
        kube: kube::Client,
    ) -> (Self, tolerable::cluster::lease::LeaderElection) {
        let holder = tolerable::cluster::lease::LeaderElection::start(
            kube.clone(),
            short_election("holder"),
            Default::default(),
        );
        let mut leads = holder.leader();
        let led = leads.wait_for(|leads| *leads);
        let give_up = std::time::Duration::from_secs(30);
        tokio::time::timeout(give_up, led)
            .await
            .expect("the holder never led")
            .unwrap();
        let server = Self::start_led(
            config,
            Some(kube),
            Leadership::compete(short_election("follower")),
        )
        .await;
        (server, holder)
    }

    async fn start_led(
        mut config: tolerable::config::Config,
        kube: Option<kube::Client>,
        leadership: Leadership,
    ) -> Self {
        super::init();
        let leaf = certs::ca().leaf(&["localhost", "127.0.0.1"]);
        let volume = SecretVolume::new(&leaf.cert_pem, &leaf.key_pem);
        config.tls_files = Some((volume.cert_path(), volume.key_path()));
        config.listen_addr = "127.0.0.1:0".parse().unwrap();
        config.metrics_addr = None;
        let webhook = Webhook::build(&config, kube, false, leadership)
            .await
            .unwrap();
        let leader = webhook.leader();
        let addr = webhook.local_addr().unwrap();
        let state = webhook.state.clone();
        let nodes = webhook.nodes.clone();
        let namespaces = webhook.namespaces.clone();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(webhook.serve(async {
            let _ = rx.await;
        }));
        Self {
            addr,
            state,
            nodes,
            namespaces,
            volume,
            leader,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }

    /// Asks the server to shut down (as SIGTERM does) and waits until it has.
    pub async fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// An HTTPS client that trusts only the test CA and resolves `localhost` to 127.0.0.1.
pub fn client() -> reqwest::Client {
    client_builder().build().unwrap()
}

pub fn client_builder() -> reqwest::ClientBuilder {
    super::init();
    let ca = reqwest::Certificate::from_pem(certs::ca().ca_pem.as_bytes()).unwrap();
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .resolve("localhost", "127.0.0.1:0".parse().unwrap())
        .no_proxy()
}

/// Posts an AdmissionReview as the API server does, with its `?timeout=`; the response (which
/// must be HTTP 200) and how long it took.
pub async fn admit(
    server: &TestServer,
    request: &serde_json::Value,
    timeout: std::time::Duration,
) -> (serde_json::Value, std::time::Duration) {
    let started = std::time::Instant::now();
    let response = client()
        .post(server.url(&format!("/mutate?timeout={}s", timeout.as_secs())))
        .header("content-type", "application/json")
        .body(request.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    (body["response"].clone(), started.elapsed())
}

/// Posts `review` to `url` on a connection of its own (for a spawned task): the HTTP status and
/// the body as JSON (`null` when it is not JSON).
pub async fn admit_owned(url: String, review: serde_json::Value) -> (u16, serde_json::Value) {
    let response = client()
        .post(url)
        .header("content-type", "application/json")
        .body(review.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// The warnings of an AdmissionReview `response`.
pub fn warnings(response: &serde_json::Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| w.as_str().unwrap().to_owned())
        .collect()
}

/// Lease settings for test replicas in namespace `tolerable`: renewed every 200 ms, so a
/// hand-over takes a fraction of a second; a Lease not renewed is another's after 3 s.
pub fn short_election(identity: &str) -> tolerable::cluster::lease::LeaderElectionSettings {
    tolerable::cluster::lease::LeaderElectionSettings {
        lease_duration: std::time::Duration::from_secs(3),
        renew_deadline: std::time::Duration::from_secs(2),
        retry_period: std::time::Duration::from_millis(200),
        ..tolerable::cluster::lease::LeaderElectionSettings::new("tolerable", identity)
    }
}

/// The server's `/metrics` text.
/// Waits until `server` answers `/readyz` with 200 (its watches synced). The 30 s only keep a
/// server that never becomes ready from hanging the test.
pub async fn until_ready(server: &TestServer) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while client()
        .get(server.url("/readyz"))
        .send()
        .await
        .unwrap()
        .status()
        != 200
    {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

pub async fn metrics_text(server: &TestServer) -> String {
    client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the sample whose series (name and labels, exactly as exposed) is `series`, as a
/// number: `"… 3"` must not match a sample of 30, nor `name` a `name_total` or `name{…}` line.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// A recorded AdmissionReview from `tests/data`, its images pointed at `registry_host`.
pub fn recorded(name: &str, registry_host: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text.replace("127.0.0.1:25000", registry_host)).unwrap()
}

/// The request's Pod with the AdmissionReview `response`'s JSON Patch applied (which must be
/// there), as the API server applies it.
pub fn patched(request: &serde_json::Value, response: &serde_json::Value) -> serde_json::Value {
    use base64::Engine as _;
    let ops = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .unwrap();
    let mut object = request["request"]["object"].clone();
    let ops: json_patch::Patch = serde_json::from_slice(&ops).unwrap();
    json_patch::patch(&mut object, &ops).unwrap();
    object
}

/// A Pod's tolerations under `kubernetes.io/arch`, in order.
pub fn arch_tolerations(pod: &serde_json::Value) -> Vec<serde_json::Value> {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["key"] == tolerable::mutate::ARCH_LABEL)
        .cloned()
        .collect()
}

/// One HTTP/1.1 keep-alive connection over TLS to the server at `addr`, opened as the API
/// server's webhook client opens it (Go's net.Dialer sets TCP_NODELAY on every connection);
/// the benches' load generators send on it one request at a time.
pub async fn keep_alive_connection(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    sender
}
