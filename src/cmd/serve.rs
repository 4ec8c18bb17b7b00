//! `tolerable serve`: the webhook, built by the composition root ([`crate::app::Webhook`]).

use std::process::ExitCode;

use anyhow::Context as _;

use crate::app::{Leadership, Webhook};
use crate::cli::ServeArgs;
use crate::cluster::connect;
use crate::config::Config;
use crate::mutate::OnLookupFailure;
use crate::server;

pub(crate) async fn run(config: &Config, args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let shutdown = shutdown_signal()?;
    match server::raise_fd_limit() {
        Ok(limit) => tracing::debug!(?limit, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit to its hard limit"),
    }
    let manage_node_taints = config.manage_node_taints || args.manage_node_taints;
    let choice = args.cluster.choice();
    let gates = config.policy.on_lookup_failure == OnLookupFailure::Gate;
    // Warning Events (`[events] on_admission`, `[crashes] watch`) are written to the cluster
    // too: without one of the reads above they still need the client.
    let writes_events = config.events_on_admission || config.crash_watch;
    let reads_cluster = config.read_pull_secrets
        || config.watch_nodes
        || manage_node_taints
        || gates
        || writes_events;
    // A cluster the operator named is checked even when nothing is read of it: a typo in a
    // Deployment's arguments shows at once, not when the configuration changes.
    let kube = if reads_cluster || choice.is_explicit() {
        match connect::client(choice).await {
            Ok(client) => reads_cluster.then_some(client),
            // The cluster the operator named is unusable: refuse to start, as for bad config.
            Err(why) if choice.is_explicit() => anyhow::bail!(why),
            // Pods gated with no controller to release them would wait forever.
            Err(why) if gates => anyhow::bail!(
                "config key `policy.on_lookup_failure`: \"gate\" needs the cluster (serve's gate controller releases the Pods it gates), which cannot be read: {why}"
            ),
            // Running outside a cluster (trying it out): still useful, with the configured
            // toleration template and without pull secrets.
            Err(why) => {
                tracing::warn!(
                    reason = %why,
                    "pull secrets and node pools will not be read"
                );
                None
            }
        }
    } else {
        None
    };
    let leadership = Leadership::of_replica(config, kube.as_ref());
    let webhook = Webhook::build(config, kube, args.manage_node_taints, leadership).await?;
    webhook.serve(shutdown).await;
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM or an interrupt, listened for from the moment this is called — before the webhook is
/// built, so a Pod deleted while it starts still shuts down gracefully (a signal with no handler
/// yet would kill the process).
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("interrupt received"),
        }
    })
}
