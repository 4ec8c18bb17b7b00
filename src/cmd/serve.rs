//! `tolerable serve`: the webhook.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;

use crate::admission::Admission;
use crate::cli::ServeArgs;
use crate::cluster::nodes::{keep_nodes_tainted, NodeWatch};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::registry::Resolver;
use crate::server::tls::{self, CertStore};
use crate::server::{self, AppState};

pub async fn run(config: &Config, args: &ServeArgs) -> anyhow::Result<ExitCode> {
    match server::raise_fd_limit() {
        Ok(limit) => tracing::debug!(?limit, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit to its hard limit"),
    }
    let manage_node_taints = config.manage_node_taints || args.manage_node_taints;
    let mut metrics_registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::register(&mut metrics_registry));
    let credentials = config.credential_store()?;
    // The operator's own registries keep their metric labels whatever Pods name.
    metrics.name_registries(
        config
            .resolver
            .mirrors
            .values()
            .map(String::as_str)
            .chain(
                config
                    .resolver
                    .transport
                    .insecure_registries
                    .iter()
                    .map(String::as_str),
            )
            .chain(credentials.registries()),
    );
    let resolver = Arc::new(
        Resolver::new(config.resolver.clone(), credentials)?.with_observer(metrics.clone()),
    );
    let certs = Arc::new(match &config.tls_files {
        Some((cert, key)) => {
            CertStore::from_files(cert, key)?.with_name_check(config.tls_reload_name_check)
        }
        None => {
            // For a first run without cert-manager: a fresh CA, printed so a client can trust it.
            let names = ["localhost", "127.0.0.1", "::1"].map(String::from);
            let generated = tls::self_signed(&names)?;
            println!(
                "No ssl_cert_path/ssl_key_path configured: serving a self-signed certificate for {}.\n\
                 Trust this CA to call the webhook (e.g. curl --cacert ca.pem):\n{}",
                names.join(", "),
                generated.ca_pem
            );
            CertStore::fixed(generated.key)
        }
    });
    let listener = tokio::net::TcpListener::bind(config.listen_addr)
        .await
        .with_context(|| format!("cannot listen on {} (listen_addr)", config.listen_addr))?;
    let reloader = tokio::spawn(certs.clone().watch(Some(metrics.clone())));
    let mut admission = Admission::new(
        resolver.clone(),
        config.policy.clone(),
        Some(metrics.clone()),
    );
    let mut nodes = None;
    if config.read_pull_secrets || config.watch_nodes || manage_node_taints {
        match Cluster::client_from_environment().await {
            Ok(client) => {
                if config.read_pull_secrets {
                    admission = admission.with_cluster(Arc::new(Cluster::new(client.clone())));
                }
                let watch = (config.watch_nodes || manage_node_taints)
                    .then(|| NodeWatch::start(client.clone(), config.policy.taint_keys()));
                if let Some(watch) = &watch {
                    tokio::spawn(warn_of_fenced_off_pools(
                        watch.clone(),
                        config.taint_policy.clone(),
                    ));
                }
                if let (true, Some(watch)) = (manage_node_taints, &watch) {
                    let policy = config.taint_policy.clone();
                    tokio::spawn(keep_nodes_tainted(client, watch.clone(), policy));
                }
                if config.watch_nodes {
                    if let Some(watch) = watch {
                        admission = admission.with_nodes(watch.clone());
                        nodes = Some(watch);
                    }
                }
            }
            // Running outside a cluster (trying it out): still useful, with the configured
            // toleration template and without pull secrets.
            Err(why) => tracing::warn!(
                reason = %why,
                "no Kubernetes API configuration (in-cluster or kubeconfig): pull secrets and node pools will not be read"
            ),
        }
    }
    let state = Arc::new(AppState {
        admission,
        nodes,
        metrics,
        metrics_registry,
        resolver,
        ready: AtomicBool::new(false),
        metrics_on_webhook_port: config.metrics_addr.is_none(),
    });
    let metrics_server = match config.metrics_addr {
        Some(addr) => {
            let metrics_listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (metrics_addr)"))?;
            tracing::info!(addr = %metrics_listener.local_addr()?, "serving /metrics over plain HTTP");
            Some(tokio::spawn(server::serve_metrics(
                metrics_listener,
                state.clone(),
            )))
        }
        None => None,
    };
    tracing::info!(addr = %listener.local_addr()?, "serving the admission webhook on /mutate");
    server::run(
        listener,
        certs,
        state,
        config.server_limits.clone(),
        shutdown_signal(),
    )
    .await;
    reloader.abort();
    if let Some(metrics_server) = metrics_server {
        metrics_server.abort();
    }
    Ok(ExitCode::SUCCESS)
}

/// Says once, after the first node list, which nodes carry an architecture taint for an
/// architecture that is neither default nor supported: no Pod will ever tolerate them.
async fn warn_of_fenced_off_pools(watch: NodeWatch, policy: crate::taints::TaintPolicy) {
    watch.synced().await;
    let nodes = watch.nodes();
    for (node, arch, taint) in
        crate::taints::fenced_off_nodes(nodes.iter().map(AsRef::as_ref), &policy)
    {
        tracing::warn!(
            %node,
            architecture = %arch,
            %taint,
            "node is tainted for an architecture in neither supported_architectures nor \
             default_architectures: no Pod gets a toleration for it (add {arch} to supported_architectures)"
        );
    }
}

/// SIGTERM (what the kubelet sends) or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received"),
    }
}
