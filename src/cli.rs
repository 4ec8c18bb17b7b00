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
    /// by a TOLERABLE_<SECTION>__<KEY> environment variable.
    #[arg(long, global = true, env = "TOLERABLE_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the admission webhook (HTTPS; POST /mutate, GET /healthz /readyz /metrics).
    #[command(after_help = exit_help(SERVE_EXIT))]
    Serve(ServeArgs),
    /// Taint nodes by architecture (the other half of the scheme), or undo it.
    Nodes(NodesArgs),
    /// Decide offline for manifests: every workload (Pod, Deployment, StatefulSet, DaemonSet,
    /// Job, CronJob, every Pod template of the AI/ML and pipeline kinds) in a table, or with
    /// --patch each one's JSON Patch and patched Pod.
    #[command(after_long_help = review_help())]
    Review(ReviewArgs),
    /// Ask the registries on which platforms images can run (reads manifests, never layers).
    #[command(after_help = exit_help(INSPECT_EXIT))]
    Inspect(InspectArgs),
    /// Audit the cluster as it runs (read-only): per workload misplaced (a Pod on a node its
    /// images cannot run on), movable (could run on the other pools), ready, pinned or unknown.
    #[command(after_help = exit_help(AUDIT_EXIT))]
    Audit(AuditArgs),
    /// Pods held by tolerable's scheduling gate (on_lookup_failure = "gate"): list them, or
    /// release them unchanged (before uninstalling tolerable, or in an emergency).
    Gates(GatesArgs),
    /// What `serve`'s crash watch learned ([crashes] watch): the image digests that crashed with
    /// exec format error on an architecture their index claims, which decisions leave out. Read
    /// from, and forgotten in, the shared cache the config names ([shared_cache] url).
    Crashes(CrashesArgs),
    /// Whether the API server calls tolerable and gets its decision: a server-side dry run of a
    /// Pod create (nothing is created), and the likely cause when the decision is missing.
    #[command(after_help = exit_help(CHECK_EXIT))]
    Check(CheckArgs),
    /// Print a file generated from the code (the config reference, the chart's config values
    /// and schema, docs/cli.md's synopses and flags) as it should be committed: `make generate`
    /// writes them; a test fails when one differs. For the repository, not for operators.
    #[command(hide = true)]
    Reference(ReferenceArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ReferenceArgs {
    /// List the generated files (paths inside the repository), one per line.
    #[arg(long, conflicts_with = "file")]
    pub(crate) list: bool,

    /// The repository: the hand-written parts around a generated block are read there.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub(crate) root: PathBuf,

    /// The generated file to print, as --list names it.
    #[arg(value_name = "FILE", required_unless_present = "list")]
    pub(crate) file: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    /// A namespace the webhook covers (not tolerable's own, nor kube-system).
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,

    /// The image of the Pod tried (tolerable looks it up as for any Pod).
    #[arg(
        long,
        value_name = "IMAGE",
        default_value = "registry.k8s.io/pause:3.10"
    )]
    pub(crate) image: String,

    /// tolerable's MutatingWebhookConfiguration (the chart names it after the release).
    #[arg(long, value_name = "NAME", default_value = "tolerable")]
    pub(crate) webhook_configuration: String,
}

#[derive(Debug, Args)]
pub(crate) struct GatesArgs {
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    #[command(subcommand)]
    pub(crate) command: GatesCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum GatesCommand {
    /// List the Pods labelled tolerable.io/gated (waiting for their images, or unrunnable),
    /// with their age and what they wait for.
    #[command(after_help = exit_help(GATES_LIST_EXIT))]
    List {
        /// Only this namespace (default: every namespace).
        #[arg(short = 'n', long, value_name = "NAMESPACE")]
        namespace: Option<String>,
    },
    /// Release gated Pods unchanged: remove tolerable's gate and label (other gates stay), the
    /// annotation saying so.
    #[command(after_help = exit_help(GATES_RELEASE_EXIT))]
    Release {
        /// Every Pod labelled tolerable.io/gated (in --namespace, else in every namespace).
        #[arg(long, conflicts_with = "pods", required_unless_present = "pods")]
        all: bool,
        /// The namespace of the Pods named (default: default), or the only one --all releases in.
        #[arg(short = 'n', long, value_name = "NAMESPACE")]
        namespace: Option<String>,
        /// Pods to release, by name.
        #[arg(value_name = "POD")]
        pods: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct CrashesArgs {
    #[command(subcommand)]
    pub(crate) command: CrashesCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CrashesCommand {
    /// List the digests learned, each architecture it does not run on, the namespace whose
    /// crash taught it, and when it is forgotten.
    #[command(after_help = exit_help(CRASHES_LIST_EXIT))]
    List,
    /// Forget what was learned of a digest (every architecture, or --arch's): admissions place
    /// its Pods as its index says again (each replica within seconds).
    #[command(after_help = exit_help(CRASHES_FORGET_EXIT))]
    Forget {
        /// The image digest, as `list` shows it (sha256:…).
        #[arg(value_name = "DIGEST")]
        digest: String,
        /// Only this architecture (default: every one learned for the digest).
        #[arg(long, value_name = "ARCH")]
        arch: Option<String>,
    },
}

/// Which cluster a subcommand reads: the same flags, and the same fallback, on every subcommand
/// that reads one (`serve`, `nodes`, `audit`, `review`).
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    /// Kubeconfig file of the cluster to read. Default: $KUBECONFIG, else ~/.kube/config, else
    /// the in-cluster service account.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,

    /// Context of the kubeconfig to use. Default: its current-context.
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) context: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

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

    /// Show each workload's Pod (and each AdmissionReview) in detail: the decision, its JSON
    /// Patch and the patched Pod, under a heading naming it (--json: one array).
    #[arg(long)]
    pub(crate) patch: bool,

    /// Read the directories named, and the directories in them (a directory reached again
    /// through a symlink is read once).
    #[arg(short = 'R', long)]
    pub(crate) recursive: bool,

    /// Fail (exit status 3) when any input was skipped, whatever else was found.
    #[arg(long)]
    pub(crate) strict: bool,

    /// Per-namespace policy without a cluster: a label of NAMESPACE, as
    /// NAMESPACE:KEY=VALUE (team-a:tolerable.io/enforce=false, team-b:tolerable.io/skip=true);
    /// replaces what the cluster says of that namespace. Repeatable.
    #[arg(long = "namespace-label", value_name = "NAMESPACE:KEY=VALUE")]
    pub(crate) namespace_labels: Vec<String>,

    /// An annotation of NAMESPACE, as NAMESPACE:KEY=VALUE
    /// (batch:tolerable.io/preferred-architecture=arm64=80, amd64=20). Repeatable.
    #[arg(long = "namespace-annotation", value_name = "NAMESPACE:KEY=VALUE")]
    pub(crate) namespace_annotations: Vec<String>,

    /// Read the workloads' image pull secrets (and their ServiceAccounts') and the Namespaces'
    /// policy from the cluster, as the webhook does: the one --kubeconfig and --context name
    /// (either implies --cluster), else the one the environment names. Without any of the three
    /// no cluster is read.
    #[arg(long = "cluster", conflicts_with = "kubeconfig")]
    pub(crate) read_cluster: bool,

    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    /// Manifests (YAML, several documents, or JSON; Lists opened), directories of them, or `-`
    /// for standard input.
    #[arg(value_name = "FILE", required = true)]
    pub(crate) files: Vec<String>,
}

/// `review --help`: what is read and what is skipped.
const REVIEW_HELP: &str = "\
Workloads: every Pod template where its kind keeps it: Kubernetes' own kinds, Argo Rollouts
and Workflows, Knative, Ray, JobSet, LeaderWorkerSet, Kubeflow, KServe, Katib and Tekton (its
steps and sidecars are the containers of the Pod they run in), each named by the kind's own
names (`RayCluster/ray (workerGroupSpecs[gpu])`); in-house kinds by [workloads] pod_specs.
A kind with containers where no row looks is a skipped input naming their path.

Inputs: each file and each document is read on its own: YAML, JSON, JSON streams and JSON
Lines, UTF-8 (a byte order mark is read past) or UTF-16/UTF-32 with a byte order mark. A file
or document that is not a Kubernetes object with a kind (a kustomization, Chart.yaml, Helm
values, a JSON Patch, a Helm template with {{ }}, an empty file, a dangling symlink, a FIFO or
other file that is not a regular file in a directory, a List item without a kind, a document
nested deeper than 100 levels) is skipped: listed with its file, document number and line and
the reason, counted in the summary, and the run goes on. A Helm chart's templates/ are
skipped: review `helm template`'s output; its other manifests and crds/ are read, whichever
directory is named. Empty documents are passed over. A path named that does not exist or
cannot be read is an error (exit status 2).

Patches and partial templates: a Pod template with no containers, `containers: []`, or a
container without an image is partial (a kustomize patch, an overlay's part): it is skipped
with that reason, never reviewed; review `kubectl kustomize`'s output instead. Objects with
no Pod template at all (Services, ConfigMaps) are counted, not reviewed.

Containers: a name is optional where the kind allows it (custom kinds such as Knative
Services); Kubernetes' own kinds need one. An image that is not a string, or with white space
around it, is a problem of its container: the workload is invalid_object, with the line, and
its other images are still looked up.

Output: the table (--json: the report) for any number of workloads, a Pod or an
AdmissionReview alike; --patch shows each in detail instead. Why a registry could not be
reached (cause: lines) goes to standard error.

SOURCE is FILE:DOCUMENT (documents counted from 1, as YAML counts them; `-` is standard input).
A workload with only generateName is shown as `prefix-*`.";

/// `review --help` after the options: what is read and skipped, then the exit statuses.
fn review_help() -> String {
    format!("{REVIEW_HELP}\n\n{}", exit_help(REVIEW_EXIT))
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Keep nodes of non-default architectures tainted as they join (config: `[nodes] manage_taints`).
    #[arg(long)]
    pub(crate) manage_node_taints: bool,

    // The cluster whose pull secrets and nodes are read (when the configuration reads any).
    // Without --kubeconfig or --context a cluster that cannot be found is a warning, and the
    // webhook runs without; with either, it is an error.
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
}

#[derive(Debug, Args)]
pub(crate) struct NodesArgs {
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    #[command(subcommand)]
    pub(crate) command: NodesCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum NodesCommand {
    /// Show the taints `taint` would add or remove. Exit status 1 when anything would change.
    #[command(after_help = exit_help(NODES_PLAN_EXIT))]
    Plan,
    /// Taint every node of a supported architecture; refuses while the webhook is not ready,
    /// and when a node's architecture is neither default nor supported.
    #[command(after_help = exit_help(NODES_CHANGE_EXIT))]
    Taint {
        /// Taint even though the webhook is not registered and ready, and taint nodes of
        /// architectures that are neither default nor supported (no Pod tolerates those).
        #[arg(long)]
        force: bool,
    },
    /// Remove the taints tolerable added (and only those).
    #[command(after_help = exit_help(NODES_CHANGE_EXIT))]
    Untaint,
}

/// One exit status of a subcommand: the code the command returns and what `--help` says of it
/// (one definition for both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus {
    pub(crate) code: u8,
    pub(crate) meaning: &'static str,
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(status: ExitStatus) -> Self {
        Self::from(status.code)
    }
}

/// Every subcommand's: an error before or while running (`main` prints it).
pub const COULD_NOT_RUN: ExitStatus = ExitStatus {
    code: 2,
    meaning: "could not run: bad arguments or configuration, or what it reads could not be read (the cause is on stderr)",
};
/// Every subcommand's: `tolerable … | head` (128 + SIGPIPE, as a shell reports it).
pub const READER_STOPPED: ExitStatus = ExitStatus {
    code: 141,
    meaning: "the reader stopped reading (`| head`)",
};

pub(crate) const SERVE_EXIT: &[ExitStatus] = &[
    ExitStatus {
        code: 0,
        meaning: "stopped by SIGTERM or an interrupt, after the requests in flight were answered",
    },
    ExitStatus {
        code: 2,
        meaning: "could not start: bad configuration, the port taken, the TLS files unreadable, or the cluster --kubeconfig / --context names unusable (the cause is on stderr)",
    },
];

pub(crate) const INSPECT_OK: ExitStatus = ExitStatus {
    code: 0,
    meaning: "every image was looked up (and with --verify, every platform's config agrees)",
};
pub(crate) const INSPECT_FAILED: ExitStatus = ExitStatus {
    code: 1,
    meaning: "some image could not be looked up (its error is printed), or --verify found a platform whose config names another",
};
pub(crate) const INSPECT_EXIT: &[ExitStatus] =
    &[INSPECT_OK, INSPECT_FAILED, COULD_NOT_RUN, READER_STOPPED];

pub(crate) const AUDIT_DONE: ExitStatus = ExitStatus {
    code: 0,
    meaning: "the cluster was read and every workload reported (whatever their status: audit reports, it does not gate)",
};
pub(crate) const AUDIT_EXIT: &[ExitStatus] = &[AUDIT_DONE, COULD_NOT_RUN, READER_STOPPED];

pub(crate) const NODES_NO_CHANGE: ExitStatus = ExitStatus {
    code: 0,
    meaning: "no node's taints would change",
};
pub(crate) const NODES_WOULD_CHANGE: ExitStatus = ExitStatus {
    code: 1,
    meaning: "some node's taints would change (each change is listed)",
};
pub(crate) const NODES_PLAN_EXIT: &[ExitStatus] = &[
    NODES_NO_CHANGE,
    NODES_WOULD_CHANGE,
    COULD_NOT_RUN,
    READER_STOPPED,
];

pub(crate) const NODES_CHANGED: ExitStatus = ExitStatus {
    code: 0,
    meaning: "done: every change listed was made",
};
pub(crate) const NODES_CHANGE_EXIT: &[ExitStatus] = &[
    NODES_CHANGED,
    ExitStatus {
        code: 2,
        meaning: "could not run, or refused (the webhook not ready, without --force): nothing more was changed (the cause is on stderr)",
    },
    READER_STOPPED,
];

pub(crate) const GATES_LISTED: ExitStatus = ExitStatus {
    code: 0,
    meaning: "the gated Pods were listed (none is not an error)",
};
pub(crate) const GATES_LIST_EXIT: &[ExitStatus] = &[GATES_LISTED, COULD_NOT_RUN, READER_STOPPED];

pub(crate) const GATES_RELEASED: ExitStatus = ExitStatus {
    code: 0,
    meaning: "done: every Pod listed was released or carried no gate of tolerable's",
};
pub(crate) const GATES_NOT_FOUND: ExitStatus = ExitStatus {
    code: 1,
    meaning: "some Pod named was not found (each is listed); the others were released",
};
pub(crate) const GATES_RELEASE_EXIT: &[ExitStatus] = &[
    GATES_RELEASED,
    GATES_NOT_FOUND,
    COULD_NOT_RUN,
    READER_STOPPED,
];

pub(crate) const CRASHES_DONE: ExitStatus = ExitStatus {
    code: 0,
    meaning: "done: what was learned is listed (none is not an error), or forgotten",
};
pub(crate) const CRASHES_NOTHING_LEARNED: ExitStatus = ExitStatus {
    code: 1,
    meaning:
        "nothing was learned of that digest (or of that architecture for it): nothing forgotten",
};
pub(crate) const CRASHES_NOT_SHARED: ExitStatus = ExitStatus {
    code: 3,
    meaning: "no shared cache is configured ([shared_cache] url): what the crash watch learned lives in each replica's memory (restart the replicas to forget it)",
};
pub(crate) const CRASHES_LIST_EXIT: &[ExitStatus] = &[
    CRASHES_DONE,
    COULD_NOT_RUN,
    CRASHES_NOT_SHARED,
    READER_STOPPED,
];
pub(crate) const CRASHES_FORGET_EXIT: &[ExitStatus] = &[
    CRASHES_DONE,
    CRASHES_NOTHING_LEARNED,
    COULD_NOT_RUN,
    CRASHES_NOT_SHARED,
    READER_STOPPED,
];

pub(crate) const CHECK_DECIDING: ExitStatus = ExitStatus {
    code: 0,
    meaning: "reachable and deciding: the dry-run Pod came back with tolerable's decision",
};
pub(crate) const CHECK_NOT_DECIDING: ExitStatus = ExitStatus {
    code: 1,
    meaning: "tolerable did not decide: the message names the likely cause (not installed, caBundle, selector, unreachable, an error the API server names)",
};
pub(crate) const CHECK_EXIT: &[ExitStatus] = &[
    CHECK_DECIDING,
    CHECK_NOT_DECIDING,
    COULD_NOT_RUN,
    READER_STOPPED,
];

/// The `Exit status:` section of a subcommand's `--help`, from its table: each code right
/// aligned, its meaning wrapped under itself (clap prints this text as it is).
pub(crate) fn exit_help(statuses: &[ExitStatus]) -> String {
    const WIDTH: usize = 92;
    let mut text = String::from("Exit status:");
    for status in statuses {
        let mut line = format!("{:>3} ", status.code);
        for word in status.meaning.split(' ') {
            if line.len() + 1 + word.len() > WIDTH {
                text.push('\n');
                text.push_str(line.trim_end());
                line = " ".repeat(4);
            }
            line.push(' ');
            line.push_str(word);
        }
        text.push('\n');
        text.push_str(&line);
    }
    text
}

/// `review --strict` found no problem but skipped inputs.
pub(crate) const REVIEW_SKIPPED_INPUTS: ExitStatus = ExitStatus {
    code: 3,
    meaning: "with --strict: inputs were skipped, whatever else was found (3 outranks 1 and 4: a gate that accepts 4 still sees unread inputs)",
};
/// `review` found no problem but could not look some images up: those workloads were not
/// checked (a gate with no network must not pass by default).
pub(crate) const REVIEW_LOOKUPS_FAILED: ExitStatus = ExitStatus {
    code: 4,
    meaning: "no problem found, but some images could not be looked up (lookup_failed: registry unreachable, refused or too slow): those workloads were not checked; a gate that accepts them checks for 4 (the cause is on stderr)",
};
/// `review`'s statuses (the exit-status test runs each).
pub(crate) const REVIEW_EXIT: &[ExitStatus] = &[
    ExitStatus {
        code: 0,
        meaning: "no problem found (without --strict, skipped inputs are listed, and do not fail the run)",
    },
    ExitStatus {
        code: 1,
        meaning: "problems found: a workload's images share no architecture, it would be denied, or it is invalid (invalid_object)",
    },
    ExitStatus {
        code: 2,
        meaning: "could not run: bad arguments or configuration, a path named that does not exist or cannot be read, or no input held a Kubernetes object",
    },
    REVIEW_SKIPPED_INPUTS,
    REVIEW_LOOKUPS_FAILED,
    READER_STOPPED,
];
