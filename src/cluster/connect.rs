//! How every subcommand that reads the cluster (`serve`, `nodes`, `audit`, `review`) finds it:
//! one rule, one client. `--kubeconfig FILE` and `--context NAME` when given; else, as kubectl
//! and the Kubernetes client libraries do, `$KUBECONFIG`, else `~/.kube/config`, else the
//! in-cluster service account (`KUBERNETES_SERVICE_HOST` and the mounted token).

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// A connection to the API server that takes longer than this is not coming (a firewall
/// dropping packets): said then, rather than after the client's default 30 s.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Long enough for a watch (kube asks the server to end it within 290 s); a read silent for
/// longer is a connection gone.
const READ_TIMEOUT: Duration = Duration::from_secs(295);

/// Where the API server is, as the command line names it; both `None`: the environment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ClusterChoice<'a> {
    /// `--kubeconfig`: this file instead of `$KUBECONFIG` / `~/.kube/config` (never in-cluster).
    pub(crate) kubeconfig: Option<&'a Path>,
    /// `--context`: this context of the kubeconfig instead of its current one.
    pub(crate) context: Option<&'a str>,
}

impl ClusterChoice<'_> {
    /// The operator named the cluster: failing to reach it is an error, never a quiet fallback.
    pub(crate) fn is_explicit(&self) -> bool {
        self.kubeconfig.is_some() || self.context.is_some()
    }
}

/// The client for `choice`; the reason, naming the flag or the places looked in, when there is
/// no usable configuration.
pub(crate) async fn client(choice: ClusterChoice<'_>) -> Result<kube::Client, String> {
    let options = KubeConfigOptions {
        context: choice.context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let mut config = match (choice.kubeconfig, choice.context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?
        }
        (None, Some(context)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| format!("--context {context} ($KUBECONFIG or ~/.kube/config): {e}"))?,
        (None, None) => kube::Config::infer().await.map_err(|e| {
            format!(
                "no Kubernetes API configuration ($KUBECONFIG, ~/.kube/config or the \
                 in-cluster service account): {e}"
            )
        })?,
    };
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    kube::Client::try_from(config).map_err(|e| e.to_string())
}
