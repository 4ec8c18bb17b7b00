//! `tolerable review FILE|-`: the webhook's decision, offline, for a Pod manifest or an
//! AdmissionReview — for operators debugging and for CI pipelines.

mod inputs;
mod namespaces;
mod report;

use std::fmt::Write as _;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};

use self::inputs::Input;
use self::inputs::Inputs;
use serde_json::{json, Value};

use crate::admission::wire::{AdmissionReviewOut, ADMISSION_V1};
use crate::admission::{self, Admission};
use crate::cli::ReviewArgs;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::engine::{Engine, LookupCauses, PodAnswer, Purpose, Sources};
use crate::mutate::{Answer, Outcome};
use crate::workload::{Found, Workload};

/// What `review` answers: the core's answer, the response as the webhook would send it, and
/// the object the patch applies to.
struct DocumentAnswer {
    answer: Answer,
    out: AdmissionReviewOut,
    object: Value,
    lookup_causes: LookupCauses,
}

/// The webhook's answer for `document`: an AdmissionReview is answered as the webhook answers
/// it; a Pod manifest as a Pod CREATE in its namespace (else `default`).
async fn review_document(
    admission: &Admission,
    document: Value,
    budget: Duration,
) -> anyhow::Result<DocumentAnswer> {
    match document.get("kind").and_then(Value::as_str) {
        Some("AdmissionReview") => {
            let body = serde_json::to_vec(&document)?;
            let reviewed = admission
                .answer_review(&body, budget)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let object = document
                .pointer("/request/object")
                .cloned()
                .unwrap_or(Value::Null);
            Ok(DocumentAnswer {
                answer: reviewed.answer,
                out: reviewed.out,
                object,
                lookup_causes: reviewed.lookup_causes,
            })
        }
        Some("Pod") | None if document.get("spec").is_some() => {
            let PodAnswer {
                answer,
                shell_warnings,
                lookup_causes,
                ..
            } = admission
                .engine()
                .answer_pod_manifest(&document, budget)
                .await
                .answered;
            let allowed = AdmissionReviewOut::allow_uid(ADMISSION_V1, REVIEW_UID);
            let out = admission::respond(allowed, &answer, &shell_warnings);
            Ok(DocumentAnswer {
                answer,
                out,
                object: document,
                lookup_causes,
            })
        }
        Some(other) => bail!("expected a Pod or an AdmissionReview, got kind {other}"),
        None => bail!("expected a Pod or an AdmissionReview (no kind, no spec)"),
    }
}

/// The uid of the response `review` shows for a Pod manifest (there is no request).
const REVIEW_UID: &str = "tolerable-review";

/// What `--patch` shows in detail, in the input's order: a workload's Pod, or an
/// AdmissionReview answered as the webhook answers it.
enum Detail {
    /// Boxed: a workload's Pod is far larger than a review's document.
    Workload(Box<Workload>),
    Review {
        document: Value,
        source: String,
    },
}

pub(crate) async fn run(
    config: &Config,
    args: &ReviewArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    // A path that is not there is a mistake on the command line, not an input to skip.
    inputs::check_named(&args.files)?;
    let inputs = Inputs::new(&args.files, args.recursive);
    let client = cluster(args).await?;
    let policies = namespaces::policies(config, args, client.as_ref()).await?;
    let engine = Engine::build(
        config,
        Purpose::Review,
        Sources {
            pull_secrets: client.map(|client| Arc::new(Cluster::new(client))),
            namespaces: Some(policies.clone()),
            ..Sources::default()
        },
    )?;
    let admission = Admission::new(engine);
    let budget = crate::budget::for_review(config.resolver.lookup_timeout);
    let mut found = Found::with_kinds(config.kinds.clone());
    let mut read = 0;
    let details = inputs.flat_map(|input| {
        let mut review = None;
        match input {
            Input::Object(value, document) if is_admission_review(&value) => {
                read += 1;
                if args.patch {
                    let source = document.place.source();
                    review = Some(Detail::Review {
                        document: value,
                        source,
                    });
                } else {
                    found.add_document(admission_pod(value), &document);
                }
            }
            Input::Object(value, document) => {
                namespaces::take_in(config, &policies, &value);
                let objects = found.skipped.len();
                found.add_document(value, &document);
                // Read: it held a workload or an object (a List may hold both and bad items).
                let held = !found.workloads.is_empty() || found.skipped.len() > objects;
                read += usize::from(held);
            }
            Input::Unread(unread) => found.unread.push(unread),
        }
        let workloads = std::mem::take(&mut found.workloads);
        review
            .into_iter()
            .chain(workloads.into_iter().map(|w| Detail::Workload(Box::new(w))))
            .collect::<Vec<_>>()
    });
    if args.patch {
        let details: Vec<Detail> = details.collect();
        let outcomes = write_each(&admission, &details, budget, args.json, out).await?;
        nothing_read(read, &found)?;
        for unread in &found.unread {
            let _ = writeln!(std::io::stderr(), "skipped: {unread}");
        }
        let skipped = found.unread.len();
        return Ok(report::exit_status(outcomes, skipped, args.strict));
    }
    let workloads = details.filter_map(|detail| match detail {
        Detail::Workload(workload) => Some(*workload),
        Detail::Review { .. } => None,
    });
    let reports = report::report_all(admission.engine(), workloads, budget).await;
    nothing_read(read, &found)?;
    report::write(out, &reports, &found, args.json)?;
    Ok(report::exit_status(
        reports.iter().map(|r| r.outcome),
        found.unread.len(),
        args.strict,
    ))
}

fn is_admission_review(document: &Value) -> bool {
    document.get("kind").and_then(Value::as_str) == Some("AdmissionReview")
}

/// An AdmissionReview's Pod, for the report: its request's object in the request's namespace.
fn admission_pod(mut review: Value) -> Value {
    let namespace = review.pointer("/request/namespace").cloned();
    let mut pod = review
        .pointer_mut("/request/object")
        .map(Value::take)
        .unwrap_or(Value::Null);
    if let (Some(namespace), Some(meta)) = (namespace, pod.get_mut("metadata")) {
        if let Some(meta) = meta.as_object_mut() {
            meta.entry("namespace").or_insert(namespace);
        }
    }
    pod
}

/// "Could not run" (exit status 2): no input held a Kubernetes object, each said with why.
fn nothing_read(read: usize, found: &Found) -> anyhow::Result<()> {
    if read > 0 {
        return Ok(());
    }
    let mut message = String::from("nothing to review: no input holds a Kubernetes object");
    for unread in &found.unread {
        let _ = write!(message, "\n  {unread}");
    }
    bail!(message)
}

/// The cluster pull secrets and Namespaces are read from, when asked for.
async fn cluster(args: &ReviewArgs) -> anyhow::Result<Option<kube::Client>> {
    let choice = args.cluster.choice();
    if !(args.read_cluster || choice.is_explicit()) {
        return Ok(None);
    }
    let client = crate::cluster::connect::client(choice)
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(Some(client))
}

/// `--patch`: each workload's Pod (and each AdmissionReview) in detail, under a heading naming
/// it; with `--json` one array of what each shows, however many there are.
async fn write_each(
    admission: &Admission,
    details: &[Detail],
    budget: Duration,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<Vec<Outcome>> {
    let reviews = details.iter().map(|detail| match detail {
        Detail::Workload(w) => review_document(admission, w.pod.clone(), budget),
        Detail::Review { document, .. } => review_document(admission, document.clone(), budget),
    });
    let reviews = futures_util::future::join_all(reviews).await;
    let mut outcomes = Vec::new();
    let mut shown = Vec::new();
    for (detail, reviewed) in details.iter().zip(reviews) {
        let reviewed = reviewed?;
        if json {
            shown.push(one_json(&reviewed)?);
        } else {
            let (label, source) = match detail {
                Detail::Workload(w) => (w.label(), w.source.as_str()),
                Detail::Review { source, .. } => ("AdmissionReview".to_owned(), source.as_str()),
            };
            writeln!(out, "# {label} ({source})")?;
            write_text(out, &reviewed, &patched(&reviewed)?)?;
        }
        outcomes.push(reviewed.answer.outcome());
    }
    if json {
        serde_json::to_writer_pretty(&mut *out, &shown)?;
        writeln!(out)?;
    }
    Ok(outcomes)
}

/// The object as it would be stored: the request's object with the patch applied.
fn patched(reviewed: &DocumentAnswer) -> anyhow::Result<Value> {
    let mut patched = reviewed.object.clone();
    if !reviewed.answer.patch.is_empty() && reviewed.out.response.allowed {
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::to_value(&reviewed.answer.patch)?)?;
        json_patch::patch(&mut patched, &patch).context("applying the patch")?;
    }
    Ok(patched)
}

/// What `--json --patch` shows of one Pod or AdmissionReview.
fn one_json(reviewed: &DocumentAnswer) -> anyhow::Result<Value> {
    let patched = patched(reviewed)?;
    let response = &reviewed.out.response;
    let mut report = json!({
        "allowed": response.allowed,
        "outcome": reviewed.answer.outcome().label(),
        "summary": reviewed.answer.decision.summary(),
        "denied": response.status.as_ref().map(|s| &s.message),
        "warnings": response.warnings,
        "patch": reviewed.answer.patch,
        "pod": &patched,
        "response": reviewed.out,
    });
    if !reviewed.lookup_causes.is_empty() {
        report["causes"] = json!(reviewed.lookup_causes);
    }
    Ok(report)
}

fn write_text(
    out: &mut impl Write,
    reviewed: &DocumentAnswer,
    patched: &Value,
) -> anyhow::Result<()> {
    let response = &reviewed.out.response;
    let decision = if response.allowed {
        "allowed"
    } else {
        "denied"
    };
    writeln!(out, "decision: {decision}")?;
    writeln!(out, "outcome:  {}", reviewed.answer.outcome())?;
    let summary = reviewed.answer.decision.summary();
    if !summary.is_empty() {
        writeln!(out, "why:      {summary}")?;
    }
    if let Some(status) = &response.status {
        writeln!(out, "message:  {}", status.message)?;
    }
    for warning in &response.warnings {
        writeln!(out, "warning:  {warning}")?;
    }
    // Why a registry could not be reached: for the operator (on standard error, as the
    // exit statuses say), never in the webhook's answer.
    for (image, cause) in &reviewed.lookup_causes {
        let _ = writeln!(std::io::stderr(), "cause:    {image}: {cause}");
    }
    writeln!(
        out,
        "\n# JSON Patch\n{}",
        serde_json::to_string_pretty(&reviewed.answer.patch)?
    )?;
    if response.allowed {
        writeln!(
            out,
            "\n# Patched Pod\n{}",
            serde_yaml_ng::to_string(patched)?
        )?;
    }
    Ok(())
}
