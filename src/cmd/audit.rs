//! `tolerable audit`: the cluster as it runs. Reads the workloads, their Pods and the Nodes
//! (read-only: list and get), resolves every image once with the workloads' pull secrets as the
//! webhook does, and judges each workload ([`crate::audit::judge`]): misplaced, movable, ready,
//! pinned or unknown.

mod read;
mod requests;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Toleration;
use serde::Serialize;

use crate::audit::node_agents::{self, AgentTemplate, TaintedNode};
use crate::audit::seen::NodeSeen;
use crate::audit::{judge, Known, Placed, Status};
use crate::cli::AuditArgs;
use crate::cluster::namespaces::NamespacePolicies;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::engine::{
    Engine, PodAnswer, Purpose, Sources, Verification, VerifiedImages, WorkloadAnswer,
    WORKLOADS_AT_ONCE,
};
use crate::mutate::{explain, Decision, Policy};

use crate::workload::Workload;

use self::requests::Requests;

/// A progress line every this many workloads.
const PROGRESS_EVERY: usize = 25;

/// What `audit` reports of one workload.
#[derive(Debug, Serialize)]
struct WorkloadAudit {
    kind: String,
    namespace: Option<String>,
    name: String,
    /// A Pod's controller of a kind `audit` does not list but the kinds table knows
    /// (`RayCluster/ray`): the Pod is a workload of its own, named by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    status: Status,
    reasons: Vec<String>,
    architectures: Option<Vec<String>>,
    /// Each image and its platforms, or why they are unknown.
    images: BTreeMap<String, Result<Vec<String>, String>>,
    pods: Vec<PodPlacement>,
    /// What its Pods request in all (the template's containers × replicas).
    requests: Requests,
    /// With `--verify`: platforms an image's index claims that its image config contradicts.
    #[serde(skip_serializing_if = "Option::is_none")]
    mislabelled: Option<Vec<String>>,
    /// With `--verify`: images that could not be verified, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    unverified: Option<Vec<String>>,
    /// A DaemonSet's: the tainted nodes of an architecture its images run on that it has no
    /// Pod on (or Pods that only predate the taint), and what to do; empty when none.
    #[serde(rename = "nodeAgent", skip_serializing_if = "Option::is_none")]
    node_agent: Option<Vec<String>>,
}

/// What `--verify` found for one workload's images.
#[derive(Debug, Default)]
struct Verified {
    mislabelled: Vec<String>,
    /// Architectures some image's index claims but its config contradicts: not really common.
    false_architectures: Vec<String>,
    unverified: Vec<String>,
}

#[derive(Debug, Serialize)]
struct PodPlacement {
    name: String,
    node: String,
    architecture: Option<String>,
}

pub(crate) async fn run(
    config: &Config,
    args: &AuditArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let client = crate::cluster::connect::client(args.cluster.choice())
        .await
        .map_err(anyhow::Error::msg)?;
    let lister = crate::cluster::list::Lister {
        client: &client,
        namespace: args.namespace.as_deref(),
        page: args.chunk_size,
        progress: &progress,
    };
    let state = read::cluster(&lister, args.selector.as_deref()).await?;
    progress(&format!(
        "read {} workloads, {} nodes and {} running Pods; resolving {} images",
        state.workloads.len(),
        state.nodes,
        state.running_pods(),
        state.images.len()
    ));
    let namespaces = match config.namespace_policy {
        true => Some(namespace_preferences(&client).await),
        false => None,
    };
    let engine = Engine::build(
        config,
        Purpose::Audit,
        Sources {
            pull_secrets: Some(Arc::new(Cluster::new(client))),
            namespaces,
            ..Sources::default()
        },
    )?;
    let budget = crate::budget::for_review(config.resolver.lookup_timeout);
    let tainted = tainted_nodes(&state.tainted, &config.policy);
    // With --verify: each image checked once, whichever workloads name it.
    let verify = args.verify.then(VerifiedImages::default);
    let mut audits = Vec::with_capacity(state.workloads.len());
    let mut audited = futures_util::stream::iter(state.workloads.iter().filter_map(|seen| {
        let workload = seen.workload()?;
        let running = state.running_for(&seen.key);
        Some(audit(
            &engine,
            (workload, seen.replicas, seen.owner.clone()),
            (running, &tainted),
            budget,
            verify.as_ref(),
        ))
    }))
    .buffered(WORKLOADS_AT_ONCE);
    while let Some(audit) = audited.next().await {
        audits.push(audit);
        if audits.len() % PROGRESS_EVERY == 0 {
            progress(&format!(
                "{} of {} workloads",
                audits.len(),
                state.workloads.len()
            ));
        }
    }
    progress("done");
    if args.json {
        write_json(out, &audits, &state.gated)?;
    } else {
        write_table(out, &audits)?;
        writeln!(out, "{}", summary_line(&audits))?;
        write_node_agents(out, &audits)?;
        write_gated(out, &state.gated)?;
    }
    Ok(crate::cli::AUDIT_DONE.into())
}

/// The report as JSON, written from the audits as they are (not copied into one JSON value
/// first: on a big cluster that copy would double the report's memory).
fn write_json(
    out: &mut impl Write,
    audits: &[WorkloadAudit],
    gated: &[crate::audit::seen::GatedSeen],
) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Report<'a> {
        summary: serde_json::Value,
        workloads: &'a [WorkloadAudit],
        gated: &'a [crate::audit::seen::GatedSeen],
    }
    let report = Report {
        summary: summary_counts(audits),
        workloads: audits,
        gated,
    };
    let mut buffered = std::io::BufWriter::new(&mut *out);
    serde_json::to_writer_pretty(&mut buffered, &report)?;
    writeln!(buffered)?;
    buffered.flush()?;
    Ok(())
}

/// The Pods held by tolerable's scheduling gate, and what each waits for (its decision
/// annotation); nothing when there are none.
fn write_gated(
    out: &mut impl Write,
    gated: &[crate::audit::seen::GatedSeen],
) -> std::io::Result<()> {
    if gated.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\n{} Pods held by tolerable's scheduling gate (tolerable gates list, tolerable gates release):",
        gated.len()
    )?;
    for pod in gated {
        let state = if pod.state == "true" {
            "waiting"
        } else {
            &pod.state
        };
        writeln!(
            out,
            "  {}/{}  {state}  {}",
            pod.namespace, pod.name, pod.decision
        )?;
    }
    Ok(())
}

/// The Namespaces' preferences (`[policy] namespace_policy`), one list of their metadata; their
/// enforce and skip are not applied, as `Purpose::Audit` does with the config's. Without access
/// (403), none, said once.
async fn namespace_preferences(client: &kube::Client) -> NamespacePolicies {
    match NamespacePolicies::list(client.clone()).await {
        Ok(listed) => listed.preferences_only(),
        Err(e) => {
            progress(&format!(
                "could not list namespaces ({e}): no namespace policy, the config alone"
            ));
            NamespacePolicies::fixed([])
        }
    }
}

/// Progress for big clusters, on standard error as kubectl writes it.
fn progress(text: &str) {
    let _ = writeln!(std::io::stderr(), "tolerable audit: {text}");
}

async fn audit(
    engine: &Engine,
    (workload, replicas, owner): (Workload, u32, Option<String>),
    (running, tainted): (&[Placed], &[TaintedNode]),
    budget: Duration,
    verify: Option<&VerifiedImages>,
) -> WorkloadAudit {
    let mut verified = verify.map(|_| Verified::default());
    let WorkloadAnswer {
        answered,
        mut common,
        asked,
    } = engine.answer_workload(workload.object, budget).await;
    if let (Some(verified), Some(verified_images), Some((pod, pull_secrets))) =
        (&mut verified, verify, &asked)
    {
        // A child manifest and a config blob per platform: a few lookups' time.
        let checked = engine
            .verify(pod, pull_secrets, budget * 3, verified_images)
            .await;
        *verified = verified_platforms(&checked);
        if let Some(common) = &mut common {
            common.retain(|arch| !verified.false_architectures.contains(arch));
        }
    }
    let pools = engine
        .policy()
        .supported_architectures
        .iter()
        .cloned()
        .collect();
    let known = known(&answered, common, running, pools);
    let node_agent = (workload.kind == "DaemonSet")
        .then(|| node_agent_gaps(&workload.pod, known.common.as_deref(), running, tainted));
    let (status, mut reasons) = judge(&known);
    // What the crash watch learned (the shared cache): left out of `known` as at admission.
    reasons.extend(answered.learned.iter().cloned());
    if let Some(verified) = &verified {
        reasons.extend(verified.mislabelled.iter().cloned());
        reasons.extend(verified.unverified.iter().cloned());
    }
    WorkloadAudit {
        kind: workload.kind,
        namespace: workload.namespace,
        name: workload.name,
        owner,
        status,
        reasons,
        architectures: known.common,
        images: answered
            .facts
            .iter()
            .map(|(image, fact)| {
                let platforms = match fact {
                    Ok(fact) => Ok(fact.platforms.iter().map(|p| p.to_string()).collect()),
                    Err(failure) => Err(failure.to_string()),
                };
                (image.clone(), platforms)
            })
            .collect(),
        pods: running
            .iter()
            .map(|r| PodPlacement {
                name: r.pod.clone(),
                node: r.node.clone(),
                architecture: r.architecture.clone(),
            })
            .collect(),
        requests: Requests::of_template(&workload.pod).times(replicas),
        mislabelled: verified.as_ref().map(|v| v.mislabelled.clone()),
        unverified: verified.map(|v| v.unverified),
        node_agent,
    }
}

/// The listed nodes with an architecture taint of the policy's keys (what the node agents'
/// check looks at).
fn tainted_nodes(nodes: &[NodeSeen], policy: &Policy) -> Vec<TaintedNode> {
    let keys = policy.taint_keys();
    nodes
        .iter()
        .filter_map(|(name, arch, taints)| {
            TaintedNode::of(name.clone(), arch.clone(), taints.clone(), &keys)
        })
        .collect()
}

/// A DaemonSet's gaps on the tainted pools ([`node_agents::missing`]), from its Pod template
/// (tolerations, the nodeSelector's architecture); none while its images are unknown.
fn node_agent_gaps(
    pod: &serde_json::Value,
    common: Option<&[String]>,
    running: &[Placed],
    tainted: &[TaintedNode],
) -> Vec<String> {
    let Some(common) = common else {
        return Vec::new();
    };
    let spec = &pod["spec"];
    let tolerations: Vec<Toleration> =
        serde_json::from_value(spec["tolerations"].clone()).unwrap_or_default();
    let template = AgentTemplate {
        tolerations: &tolerations,
        architecture: spec["nodeSelector"][crate::mutate::ARCH_LABEL].as_str(),
    };
    let runs_on: BTreeSet<&str> = running.iter().map(|p| p.node.as_str()).collect();
    node_agents::missing(template, common, &runs_on, tainted)
}

/// The DaemonSets missing from tainted nodes their images run on, after the table; nothing
/// when there are none.
fn write_node_agents(out: &mut impl Write, audits: &[WorkloadAudit]) -> std::io::Result<()> {
    let gaps: Vec<(String, &Vec<String>)> = audits
        .iter()
        .filter_map(|a| Some((label(a), a.node_agent.as_ref().filter(|g| !g.is_empty())?)))
        .collect();
    if gaps.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\n{} DaemonSets missing from tainted nodes their images run on (their controller creates \
         no Pod where the template does not tolerate a taint):",
        gaps.len()
    )?;
    for (label, reasons) in gaps {
        for reason in reasons {
            writeln!(out, "  {label}  {reason}")?;
        }
    }
    Ok(())
}

/// `mislabelled image: the index says linux/arm64, its config linux/amd64`, the architectures
/// that makes false, and the images that could not be verified.
fn verified_platforms(checked: &[(String, Verification)]) -> Verified {
    let mut verified = Verified::default();
    for (image, result) in checked {
        match result {
            Ok(checks) => {
                for c in checks.iter().filter(|c| c.mislabelled()) {
                    verified.mislabelled.push(format!(
                        "mislabelled {image}: the index says {}, its config {}",
                        c.claimed, c.actual
                    ));
                    verified
                        .false_architectures
                        .push(c.claimed.architecture.to_string());
                }
            }
            Err(e) => verified
                .unverified
                .push(format!("could not verify {image}: {e}")),
        }
    }
    verified
}

/// What the judgement needs, from the answer the webhook would give the workload's Pod.
fn known(
    answered: &PodAnswer,
    common: Option<Vec<String>>,
    running: &[Placed],
    pools: Vec<String>,
) -> Known {
    let mut unknown = Vec::new();
    let mut single_architecture = Vec::new();
    for (image, fact) in &answered.facts {
        match fact {
            Err(failure) => unknown.push(format!("{image}: {failure}")),
            Ok(fact) if fact.artifact.is_none() => {
                let linux: Vec<_> = fact
                    .platforms
                    .iter()
                    .filter(|p| &*p.os == "linux")
                    .collect();
                if let [only] = linux[..] {
                    single_architecture.push(format!("{image} ({only})"));
                }
            }
            Ok(_) => {}
        }
    }
    if common.is_none() && unknown.is_empty() {
        unknown.push(answered.answer.decision.summary().to_owned());
    }
    let additions = match &answered.answer.decision {
        Decision::Placed(placement) => explain::additions(placement),
        _ => Vec::new(),
    };
    Known {
        common,
        unknown,
        single_architecture,
        additions,
        running: running.to_vec(),
        pools,
    }
}

fn label(audit: &WorkloadAudit) -> String {
    let label = crate::workload::label(&audit.kind, audit.namespace.as_deref(), &audit.name);
    match &audit.owner {
        Some(owner) => format!("{label} (of {owner})"),
        None => label,
    }
}

/// `WORKLOAD  STATUS  ARCHITECTURES  REASON`, columns as wide as their widest cell; misplaced
/// first.
fn write_table(out: &mut impl Write, audits: &[WorkloadAudit]) -> std::io::Result<()> {
    let mut sorted: Vec<&WorkloadAudit> = audits.iter().collect();
    sorted.sort_by_key(|a| (a.status, label(a)));
    let rows: Vec<[String; 4]> = sorted
        .iter()
        .map(|a| {
            let architectures = crate::cmd::architectures_cell(a.architectures.as_deref());
            [
                label(a),
                a.status.label().to_owned(),
                architectures,
                a.reasons.join("; "),
            ]
        })
        .collect();
    crate::cmd::write_table(
        out,
        ["WORKLOAD", "STATUS", "ARCHITECTURES", "REASON"],
        &rows,
    )
}

fn summary_counts(audits: &[WorkloadAudit]) -> serde_json::Value {
    let mut counts = serde_json::Map::new();
    for status in Status::ALL {
        let n = audits.iter().filter(|a| a.status == status).count();
        counts.insert(status.label().to_owned(), n.into());
    }
    let movable = movable_requests(audits);
    serde_json::json!({
        "workloads": audits.len(),
        "statuses": counts,
        "movableRequests": movable,
    })
}

fn movable_requests(audits: &[WorkloadAudit]) -> Requests {
    audits
        .iter()
        .filter(|a| a.status == Status::Movable)
        .fold(Requests::default(), |sum, a| sum.plus(&a.requests))
}

/// `7 workloads: 1 misplaced, 3 movable, …; movable requests: cpu 1250m, memory 640Mi`.
fn summary_line(audits: &[WorkloadAudit]) -> String {
    let counts: Vec<String> = Status::ALL
        .iter()
        .map(|s| {
            let n = audits.iter().filter(|a| a.status == *s).count();
            format!("{n} {}", s.label())
        })
        .collect();
    format!(
        "{} workloads: {}; requests that could move: {}",
        audits.len(),
        counts.join(", "),
        movable_requests(audits)
    )
}
