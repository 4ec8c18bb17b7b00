//! The composition root: everything `tolerable serve` runs, built from one validated [`Config`]
//! in one place — metrics, the resolver, certificates, the listeners, the admission shell and,
//! given a Kubernetes client, the pull-secret reader, the node watch and the node tainter.
//! `cmd/serve` builds it from the process's environment; the tests build it from a `Config` and
//! a client of the fake API server, so they run the wiring users run.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admission::Admission;
use crate::cluster::events::Recorder;
use crate::cluster::lease::{LeaderElection, LeaderElectionSettings};
use crate::cluster::namespaces::NamespacePolicies;
use crate::cluster::nodes::{keep_nodes_tainted, NodeWatch};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::engine::{Engine, Purpose, Sources};
use crate::gates::GatedPods;
use crate::metrics::Metrics;
use crate::mutate::OnLookupFailure;
use crate::registry::Resolver;
use crate::server::tls::{self, CertStore};
use crate::server::{self, AppState, GaugeRefresh, ReadinessCheck, ServerLimits};

/// The webhook, built and listening, not yet serving.
pub struct Webhook {
    pub state: Arc<AppState>,
    /// The node watch, when it feeds decisions (the server is not ready before it has synced).
    pub nodes: Option<NodeWatch>,
    /// The namespace watch, when per-namespace policy is read (`[policy] namespace_policy`).
    pub namespaces: Option<NamespacePolicies>,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    certs: Arc<CertStore>,
    limits: ServerLimits,
    /// Certificate reloads, the node tainter, warnings: stopped when serving ends.
    background: Vec<JoinHandle<()>>,
    /// Which replica releases gated Pods, when this one competes (see [`elects_a_leader`]).
    leader_election: Option<LeaderElection>,
}

impl Webhook {
    /// Builds everything `config` asks for — the one way `serve` and the tests' server are
    /// made. `kube` is the Kubernetes API (`None` outside a cluster: then no pull secrets, node
    /// pools or node tainting); `manage_node_taints` adds `serve --manage-node-taints` to the
    /// config's own setting; `leadership` says who decides whether this replica releases gated
    /// Pods ([`Leadership::of_replica`] for `serve`): [`Webhook::leader`] then says whether it
    /// leads, and `serve` gives the Lease up when it shuts down.
    pub async fn build(
        config: &Config,
        kube: Option<kube::Client>,
        manage_node_taints: bool,
        leadership: Leadership,
    ) -> anyhow::Result<Self> {
        let mut metrics_registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::register(&mut metrics_registry));
        // Listen first: a second `serve` in the same directory must fail on its port before it
        // writes a self-signed CA over the running one's.
        let (listener, metrics_listener) = listeners(config).await?;
        let certs = Arc::new(certificates(config)?);
        let mut background = vec![tokio::spawn(certs.clone().watch(Some(metrics.clone())))];
        let namespaces = watch_namespaces(config, kube.as_ref(), &metrics, &mut metrics_registry);
        let manage_node_taints = config.manage_node_taints || manage_node_taints;
        let (election, leader) = leadership.start(
            kube.as_ref(),
            &metrics,
            &mut metrics_registry,
            &mut background,
        );
        let (pull_secrets, nodes) = match &kube {
            Some(client) => {
                wire_cluster(config, client.clone(), manage_node_taints, &mut background)
            }
            None => (None, None),
        };
        let sources = Sources {
            metrics: Some(metrics.clone()),
            pull_secrets,
            nodes: nodes.clone(),
            namespaces: namespaces.clone(),
        };
        let (admission, gated) =
            admission_and_gates(config, kube, sources, leader, &mut background)?;
        if nodes.is_some() {
            metrics.register_node_watch(&mut metrics_registry);
        }
        metrics.set_certificate_expiry(certs.not_after());
        metrics.set_registry_ca_expiry(
            config
                .resolver
                .transport
                .extra_roots_pem
                .iter()
                .filter_map(|pem| crate::x509::earliest_not_after(pem))
                .min(),
        );
        let state = Arc::new(AppState {
            readiness: readiness(nodes.clone(), namespaces.clone()),
            refresh_gauges: scrape_time_gauges(
                &metrics,
                admission.engine().resolver().clone(),
                &nodes,
                &namespaces,
                gated,
            ),
            admission,
            metrics,
            metrics_registry,
            ready: AtomicBool::new(false),
            metrics_on_webhook_port: config.metrics_addr.is_none(),
            load: server::Load::new(&config.server_limits),
        });
        Ok(Self {
            state,
            nodes,
            namespaces,
            listener,
            metrics_listener,
            certs,
            limits: config.server_limits.clone(),
            background,
            leader_election: election,
        })
    }

    /// Whether this replica leads the gate releasers now (`None`: it does not compete). The
    /// releaser runs only while the receiver says `true`.
    pub fn leader(&self) -> Option<watch::Receiver<bool>> {
        self.leader_election.as_ref().map(LeaderElection::leader)
    }

    /// Where the webhook listens (the port chosen when `listen_addr` says 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then drains and stops the background tasks.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let mut background = self.background;
        if let Some(listener) = self.metrics_listener {
            tracing::info!(addr = ?listener.local_addr().ok(), "serving /metrics over plain HTTP");
            background.push(tokio::spawn(server::serve_metrics(
                listener,
                self.state.clone(),
            )));
        }
        tracing::info!(addr = ?self.listener.local_addr().ok(), "serving the admission webhook on /mutate");
        // On shutdown, the Lease is given up at once, while the server drains: another replica
        // takes over releasing gated Pods without waiting for the lease to run out.
        let leader_election = self.leader_election;
        let (releasing, released) = tokio::sync::oneshot::channel();
        let shutdown = async move {
            shutdown.await;
            if let Some(election) = leader_election {
                let _ = releasing.send(tokio::spawn(election.shutdown()));
            }
        };
        server::run(self.listener, self.certs, self.state, self.limits, shutdown).await;
        if let Ok(release) = released.await {
            let _ = release.await;
        }
        for task in background {
            task.abort();
        }
    }
}

/// The one engine `serve` decides with — the admission shell's and the gate controller's — and
/// the gate controller when configured. On an error the tasks already started are stopped.
fn engine_and_gates(
    config: &Config,
    kube: Option<kube::Client>,
    sources: Sources,
    leader: watch::Receiver<bool>,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<(Engine, Option<GatedPods>)> {
    let metrics = sources.metrics.clone().expect("serve counts");
    let built = Engine::build(config, Purpose::Admit, sources).and_then(|engine| {
        let gated = start_gates(config, kube, &engine, &metrics, leader, background)?;
        Ok((engine, gated))
    });
    if built.is_err() {
        background.iter().for_each(JoinHandle::abort);
    }
    built
}

/// Whether `serve` competes for the gate releasers' Lease: only where gated Pods are released
/// (`policy.on_lookup_failure = "gate"`, which brings the releaser and the Lease RBAC of
/// `kustomize/components/gates`) or crashes looked at (`[crashes] watch`,
/// `kustomize/components/crash-watch`); every replica keeps serving admissions either way.
fn elects_a_leader(config: &Config) -> bool {
    config.policy.on_lookup_failure == OnLookupFailure::Gate || config.crash_watch
}

/// The webhook's listener and, with `server.metrics_addr`, the metrics one.
async fn listeners(config: &Config) -> anyhow::Result<(TcpListener, Option<TcpListener>)> {
    let listener = TcpListener::bind(config.listen_addr)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (server.listen_addr)",
                config.listen_addr
            )
        })?;
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (server.metrics_addr)"))?,
        ),
        None => None,
    };
    Ok((listener, metrics_listener))
}

/// Whether this replica competes for the gate releasers' Lease, and with which settings: not
/// competing, what only a leader does (the gate releaser, the crash watch) it always does.
pub struct Leadership(Option<LeaderElectionSettings>);

impl Leadership {
    /// `serve`'s: competing for the Lease as this replica where gated Pods are released (see
    /// [`elects_a_leader`]) and a cluster is read; else not competing.
    pub fn of_replica(config: &Config, kube: Option<&kube::Client>) -> Self {
        match kube.filter(|_| elects_a_leader(config)) {
            Some(kube) => Self::compete(LeaderElectionSettings::for_replica(kube)),
            None => Self::alone(),
        }
    }

    /// Competing for the Lease `settings` names (a replica's own timings or identity).
    pub fn compete(settings: LeaderElectionSettings) -> Self {
        Self(Some(settings))
    }

    /// Not competing: where nothing gates Pods, or one replica runs alone.
    pub fn alone() -> Self {
        Self(None)
    }

    /// The election, when this replica competes, and the receiver the gate releaser follows:
    /// the election's, or (not competing) one that always says "leading", its sender living as
    /// long as the background tasks.
    fn start(
        self,
        kube: Option<&kube::Client>,
        metrics: &Metrics,
        registry: &mut prometheus_client::registry::Registry,
        background: &mut Vec<JoinHandle<()>>,
    ) -> (Option<LeaderElection>, watch::Receiver<bool>) {
        let Leadership(settings) = self;
        let election = compete_for_gates(kube, settings, metrics, registry);
        let leader = election.as_ref().map(LeaderElection::leader);
        let leader = leader.unwrap_or_else(|| {
            let (always, leader) = watch::channel(true);
            background.push(tokio::spawn(async move { always.closed().await }));
            leader
        });
        (election, leader)
    }
}

/// The leader election, with its gauge registered, where this replica competes.
fn compete_for_gates(
    kube: Option<&kube::Client>,
    election: Option<LeaderElectionSettings>,
    metrics: &Metrics,
    registry: &mut prometheus_client::registry::Registry,
) -> Option<LeaderElection> {
    let (client, settings) = kube.zip(election)?;
    metrics.register_gate_leader(registry);
    Some(leader_election(client.clone(), settings, metrics))
}

/// Starts competing for the gate releasers' Lease (`tolerable-gates` in tolerable's namespace),
/// keeping `tolerable_gate_leader` (register it with [`Metrics::register_gate_leader`]). The
/// gate releaser runs while [`LeaderElection::leader`] says `true`; [`LeaderElection::shutdown`]
/// gives the Lease up.
pub(crate) fn leader_election(
    client: kube::Client,
    settings: LeaderElectionSettings,
    metrics: &Metrics,
) -> LeaderElection {
    tracing::info!(lease = %settings.lease_name, namespace = %settings.namespace, identity = %settings.identity, "competing for the gate releasers' lease");
    LeaderElection::start(client, settings, metrics.gate_leader())
}

/// What readiness waits for besides the server: the node watch's first full list, when it
/// feeds decisions (before it, every Pod would be decided without the cluster's pools), and
/// the namespace watch's first list — or its refusal (403), after which decisions keep to the
/// config: a refused watch never holds readiness back.
fn readiness(nodes: Option<NodeWatch>, namespaces: Option<NamespacePolicies>) -> ReadinessCheck {
    Box::new(move || match (&nodes, &namespaces) {
        (Some(nodes), _) if !nodes.is_synced() => Err("not ready: node watch not synced\n"),
        (_, Some(namespaces)) if !namespaces.is_settled() => {
            Err("not ready: namespace watch not synced\n")
        }
        _ => Ok(()),
    })
}

/// The gauges read at scrape time that the server does not own: the lookup cache's entries
/// and, with a node watch, its last sync, size and the architectures it has seen; with the gate
/// controller, the age of the oldest gated Pod.
fn scrape_time_gauges(
    metrics: &Arc<Metrics>,
    resolver: Arc<Resolver>,
    nodes: &Option<NodeWatch>,
    namespaces: &Option<NamespacePolicies>,
    gated: Option<GatedPods>,
) -> GaugeRefresh {
    let (metrics, nodes, namespaces) = (metrics.clone(), nodes.clone(), namespaces.clone());
    Box::new(move || {
        let (metrics, resolver, nodes) = (metrics.clone(), resolver.clone(), nodes.clone());
        let namespaces = namespaces.clone();
        let oldest_gated = gated.as_ref().and_then(GatedPods::oldest_age);
        Box::pin(async move {
            metrics.set_cache_entries(resolver.cached_entries().await);
            metrics.gates.set_oldest_age(oldest_gated);
            if let Some(namespaces) = namespaces {
                metrics.set_namespace_watch(&crate::metrics::NamespaceWatchState {
                    available: namespaces.is_available(),
                    namespaces: namespaces.len(),
                    updates: namespaces.updates(),
                    refusals: namespaces.refusals(),
                });
            }
            let Some(nodes) = nodes else {
                return;
            };
            metrics.set_node_watch_synced(nodes.last_synced());
            metrics.set_node_watch_size(
                nodes.pool_builds(),
                nodes.node_count(),
                nodes.events_seen(),
            );
            if let Some(pools) = nodes.pools() {
                metrics.set_architectures(&pools);
            }
        })
    })
}

/// Where `serve` writes the CA of its self-signed certificate, in its working directory.
pub(crate) const SELF_SIGNED_CA_FILE: &str = "tolerable-ca.pem";

/// The serving certificate: the configured files (reloaded as they change), else — for a first
/// run without cert-manager — a fresh CA, printed and written to [`SELF_SIGNED_CA_FILE`] so a
/// client can trust it.
fn certificates(config: &Config) -> anyhow::Result<CertStore> {
    if let Some((cert, key)) = &config.tls_files {
        return Ok(CertStore::from_files(cert, key)?.with_name_check(config.tls_reload_name_check));
    }
    let names = ["localhost", "127.0.0.1", "::1"].map(String::from);
    let generated = tls::self_signed(&names)?;
    let saved = match std::fs::write(SELF_SIGNED_CA_FILE, &generated.ca_pem) {
        Ok(()) => format!(
            "written to {} (curl --cacert {SELF_SIGNED_CA_FILE})",
            std::env::current_dir()
                .map(|dir| dir.join(SELF_SIGNED_CA_FILE))
                .unwrap_or_else(|_| SELF_SIGNED_CA_FILE.into())
                .display()
        ),
        Err(e) => format!("not written to {SELF_SIGNED_CA_FILE}: {e}; save it from here"),
    };
    println!(
        "No tls.cert_path/tls.key_path configured: serving a self-signed certificate for {}.\n\
         Trust this CA to call the webhook; it is {saved}:\n{}",
        names.join(", "),
        generated.ca_pem
    );
    Ok(CertStore::fixed(generated.key))
}

/// The engine and the gate controller ([`engine_and_gates`]), then the Event recorder and the
/// crash watch ([`start_events`]): the admission shell and the gated Pods' watch.
fn admission_and_gates(
    config: &Config,
    kube: Option<kube::Client>,
    sources: Sources,
    leader: watch::Receiver<bool>,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<(Admission, Option<GatedPods>)> {
    let (metrics, nodes) = (
        sources.metrics.clone().expect("serve counts"),
        sources.nodes.clone(),
    );
    let (engine, gated) =
        engine_and_gates(config, kube.clone(), sources, leader.clone(), background)?;
    let watching = (&metrics, &nodes, leader);
    let (engine, events) = start_events(config, kube.as_ref(), engine, watching, background)?;
    let admission = match events {
        Some(events) => Admission::new(engine).with_events(events),
        None => Admission::new(engine),
    };
    Ok((admission, gated))
}

/// What the crash watch reads besides the engine: the metrics, the node watch, whether this
/// replica leads.
type Watching<'a> = (
    &'a Arc<Metrics>,
    &'a Option<NodeWatch>,
    watch::Receiver<bool>,
);

/// `[events] on_admission` or `[crashes] watch` with a cluster: the Event recorder (its queue
/// drained by a task of its own) — given back for admissions to hand their owners' Warning
/// Events to, with `[events] on_admission` — and the crash watch (`crate::crashes`), which
/// writes through it while `leader` says so and teaches the engine what it learns.
fn start_events(
    config: &Config,
    kube: Option<&kube::Client>,
    engine: Engine,
    (metrics, nodes, leader): Watching<'_>,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<(Engine, Option<Recorder>)> {
    if !config.events_on_admission && !config.crash_watch {
        return Ok((engine, None));
    }
    let Some(client) = kube else {
        anyhow::bail!(
            "config keys `events.on_admission` and `crashes.watch`: Warning Events need the cluster (serve writes them through the API server)"
        );
    };
    let (recorder, task) = Recorder::start(client.clone(), Some(metrics.clone()));
    background.push(task);
    if let Some(learned) = engine.learned().filter(|_| config.crash_watch) {
        // The engine's own (the gate controller's clone shares it): what the watch learns,
        // admissions and releases leave out.
        let learned = learned.clone();
        background.extend(learned.refresh());
        let heal = config.crash_heal.then(|| crash_placement(&engine));
        background.extend(crate::crashes::start(
            client.clone(),
            (recorder.clone(), nodes.clone(), learned),
            engine.resolver().clone(),
            &config.policy,
            metrics.clone(),
            leader,
            heal,
        ));
    }
    Ok((engine, config.events_on_admission.then_some(recorder)))
}

/// `[crashes] heal`: where a crashed Pod's images would go now, decided by `engine` (which
/// leaves out what the crash watch learned).
fn crash_placement(engine: &Engine) -> crate::crashes::Placement {
    let engine = engine.clone();
    Arc::new(move |namespace: String, labels, images: Vec<String>| {
        let engine = engine.clone();
        Box::pin(async move {
            engine
                .placement_now(
                    &namespace,
                    &labels,
                    &images,
                    crate::crashes::PLACEMENT_BUDGET,
                )
                .await
        })
    })
}

/// The gate controller, with `on_lookup_failure = "gate"` and a cluster: the watch of gated
/// Pods (every replica, for the oldest-age gauge) and their releaser (while `leader`).
fn start_gates(
    config: &Config,
    kube: Option<kube::Client>,
    engine: &Engine,
    metrics: &Arc<Metrics>,
    leader: tokio::sync::watch::Receiver<bool>,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Option<GatedPods>> {
    if config.policy.on_lookup_failure != OnLookupFailure::Gate {
        return Ok(None);
    }
    let Some(client) = kube else {
        anyhow::bail!(
            "config key `policy.on_lookup_failure`: \"gate\" needs the cluster: serve's gate controller releases the Pods it gates"
        );
    };
    let (gated, tasks) = crate::gates::start(
        client,
        engine.clone(),
        metrics.clone(),
        config.gate_timeout,
        leader,
    );
    background.extend(tasks);
    Ok(Some(gated))
}

/// `[policy] namespace_policy` with a cluster: the namespace watch, which admissions decide
/// with, and its metrics.
fn watch_namespaces(
    config: &Config,
    kube: Option<&kube::Client>,
    metrics: &Metrics,
    registry: &mut prometheus_client::registry::Registry,
) -> Option<NamespacePolicies> {
    let client = kube.filter(|_| config.namespace_policy)?;
    metrics.register_namespace_watch(registry);
    Some(NamespacePolicies::watch(client.clone()))
}

/// What the Kubernetes API gives: the pull-secret reader, the node watch (for decisions,
/// readiness and the tainter), the node tainter.
fn wire_cluster(
    config: &Config,
    client: kube::Client,
    manage_node_taints: bool,
    background: &mut Vec<JoinHandle<()>>,
) -> (Option<Arc<Cluster>>, Option<NodeWatch>) {
    let pull_secrets = config
        .read_pull_secrets
        .then(|| Arc::new(Cluster::new(client.clone())));
    if !(config.watch_nodes || manage_node_taints) {
        return (pull_secrets, None);
    }
    let label_keys = config.policy.match_node_labels.iter().cloned().collect();
    let watch =
        NodeWatch::start_with_labels(client.clone(), config.policy.taint_keys(), label_keys);
    background.push(tokio::spawn(warn_of_fenced_off_pools(
        watch.clone(),
        config.taint_policy.clone(),
    )));
    if manage_node_taints {
        let policy = config.taint_policy.clone();
        background.push(tokio::spawn(keep_nodes_tainted(
            client,
            watch.clone(),
            policy,
        )));
    }
    (pull_secrets, config.watch_nodes.then_some(watch))
}

/// Says once, after the first node list, which nodes carry an architecture taint for an
/// architecture that is neither default nor supported: no Pod will ever tolerate them.
async fn warn_of_fenced_off_pools(watch: NodeWatch, policy: crate::taints::TaintPolicy) {
    watch.synced().await;
    let nodes = watch.nodes();
    for (node, arch, taint) in crate::taints::fenced_off_nodes(&nodes, &policy) {
        tracing::warn!(
            %node,
            architecture = %arch,
            %taint,
            "node is tainted for an architecture in neither supported_architectures nor \
             default_architectures: no Pod gets a toleration for it (add {arch} to supported_architectures)"
        );
    }
}
