//! Command-line interface: argument shapes only, no logic.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tolerable",
    version,
    about = "Kubernetes admission webhook that lets Pods onto the architecture pools their images can run on"
)]
pub struct Cli {
    /// Config file (TOML). Default: ./tolerable.toml when it exists. Every key can be overridden
    /// by a TOLERABLE_<KEY> environment variable.
    #[arg(long, global = true, env = "TOLERABLE_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the admission webhook (HTTPS; POST /mutate, GET /healthz /readyz /metrics).
    Serve(ServeArgs),
    /// Taint nodes by architecture (the other half of the scheme), or undo it.
    #[command(subcommand)]
    Nodes(NodesCommand),
    /// Decide offline for manifests: every workload (Pod, Deployment, StatefulSet, DaemonSet,
    /// Job, CronJob, any kind with a Pod template) in a table, or one Pod / AdmissionReview with
    /// its JSON Patch and patched Pod.
    #[command(after_long_help = REVIEW_HELP)]
    Review(ReviewArgs),
    /// Ask the registries on which platforms images can run (reads manifests, never layers).
    Inspect(InspectArgs),
    /// Audit the cluster as it runs (read-only): per workload misplaced (a Pod on a node its
    /// images cannot run on), movable (could run on the other pools), ready, pinned or unknown.
    Audit(AuditArgs),
}

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// Kubeconfig file. Default: in-cluster, else $KUBECONFIG, else ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,

    /// Only this namespace.
    #[arg(
        short = 'n',
        long,
        value_name = "NAMESPACE",
        conflicts_with = "all_namespaces"
    )]
    pub(crate) namespace: Option<String>,

    /// Every namespace (the default).
    #[arg(short = 'A', long)]
    pub(crate) all_namespaces: bool,

    /// Only workloads (and Pods) with these labels (`app=web,tier!=db`).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub(crate) selector: Option<String>,

    /// Print one JSON object for machines.
    #[arg(long)]
    pub(crate) json: bool,

    /// Also read each image's platform configs and report mislabelled ones (one blob GET per
    /// platform).
    #[arg(long)]
    pub(crate) verify: bool,

    /// Items per page of each list (the API server's `limit`), as kubectl's --chunk-size.
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) chunk_size: u32,
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// Print one JSON array, one object per image, in argument order.
    #[arg(long)]
    pub(crate) json: bool,

    /// Also read each platform's image config and report where the index says one
    /// architecture and the config another (one blob GET per platform). Exit status 1 then.
    #[arg(long)]
    pub(crate) verify: bool,

    /// Image references as a Pod spec would name them (nginx, ghcr.io/org/app:1.2@sha256:…).
    #[arg(required = true, value_name = "IMAGE")]
    pub(crate) images: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ReviewArgs {
    /// Print JSON for machines.
    #[arg(long)]
    pub(crate) json: bool,

    /// Show each workload's JSON Patch and patched Pod (what one Pod or AdmissionReview shows).
    #[arg(long)]
    pub(crate) patch: bool,

    /// Read the directories named, and the directories in them (a directory reached again
    /// through a symlink is read once).
    #[arg(short = 'R', long)]
    pub(crate) recursive: bool,

    /// Fail (exit status 3) when any input was skipped, not only on problems found.
    #[arg(long)]
    pub(crate) strict: bool,

    /// Read the workloads' image pull secrets (and their ServiceAccounts') from the cluster of
    /// this kubeconfig, as the webhook does.
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,

    /// Read pull secrets from the cluster the environment names: in-cluster, $KUBECONFIG or
    /// ~/.kube/config.
    #[arg(long, conflicts_with = "kubeconfig")]
    pub(crate) cluster: bool,

    /// Manifests (YAML, several documents, or JSON; Lists opened), directories of them, or `-`
    /// for standard input.
    #[arg(value_name = "FILE", required = true)]
    pub(crate) files: Vec<String>,
}

/// `review --help`: what is read, what is skipped, and the exit statuses.
const REVIEW_HELP: &str = "\
Inputs: each file and each document is read on its own. A file or document that is not a
Kubernetes object with a kind (a kustomization, Chart.yaml, Helm values, a JSON Patch, a
Helm template with {{ }}, an empty file, a dangling symlink, a List item without a kind) is
skipped: listed with its file, document number and line and the reason, counted in the
summary, and the run goes on. The files of a Helm chart (a directory with Chart.yaml; not
its crds/) are skipped: review `helm template`'s output. Empty documents are passed over.

Patches and partial templates: a Pod template with no containers, `containers: []`, or a
container without an image is partial (a kustomize patch, an overlay's part): it is skipped
with that reason, never reviewed; review `kubectl kustomize`'s output instead. Objects with
no Pod template at all (Services, ConfigMaps) are counted, not reviewed.

Containers: a name is optional where the kind allows it (custom kinds such as Knative
Services); Kubernetes' own kinds need one. An image that is not a string is a problem of its
container: the workload is invalid_object, with the line, and its other images are still
looked up.

SOURCE is FILE:DOCUMENT (documents counted from 1, as YAML counts them; `-` is standard input).
A workload with only generateName is shown as `prefix-*`.

Exit status:
  0  no problem found (skipped inputs are listed, and do not fail the run)
  1  problems found: a workload's images share no architecture, it would be denied, or it is
     invalid (invalid_object)
  2  could not run: bad arguments or configuration, or no input held a Kubernetes object
  3  with --strict: no problem found, but inputs were skipped
  4  no problem found, but some images could not be looked up (lookup_failed: registry
     unreachable, refused or too slow): those workloads were not checked; a gate that
     accepts them checks for 4 (the cause is on stderr)
141  the reader stopped reading (`| head`)";

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Keep nodes of non-default architectures tainted as they join (config: manage_node_taints).
    #[arg(long)]
    pub(crate) manage_node_taints: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum NodesCommand {
    /// Show the taints `taint` would add or remove. Exit status 1 when anything would change.
    Plan,
    /// Taint every node of a supported architecture; refuses while the webhook is not ready,
    /// and when a node's architecture is neither default nor supported.
    Taint {
        /// Taint even though the webhook is not registered and ready, and taint nodes of
        /// architectures that are neither default nor supported (no Pod tolerates those).
        #[arg(long)]
        force: bool,
    },
    /// Remove the taints tolerable added (and only those).
    Untaint,
}
