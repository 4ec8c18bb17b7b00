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
use crate::admission::{self, Admission, LookupCauses, PodAnswer};
use crate::cli::ReviewArgs;
use crate::cluster::Cluster;
use crate::config::Config;
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

/// One Pod or AdmissionReview: shown with its JSON Patch and patched object, as the webhook
/// would answer it.
fn is_single_object(inputs: &[Input]) -> bool {
    match inputs {
        [Input::Object(document, _)] => matches!(
            document.get("kind").and_then(Value::as_str),
            Some("Pod" | "AdmissionReview")
        ),
        _ => false,
    }
}

pub(crate) async fn run(
    config: &Config,
    args: &ReviewArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let mut inputs = Inputs::new(&args.files, args.recursive);
    // Two inputs tell one Pod or AdmissionReview (shown in detail) from a set of workloads.
    let head: Vec<Input> = inputs.by_ref().take(2).collect();
    let resolver = Arc::new(crate::app::resolver(config, None)?);
    let mut admission = Admission::new(resolver, config.policy.clone(), None);
    let client = cluster(args).await?;
    let policies = namespaces::policies(config, args, client.as_ref()).await?;
    admission = admission.with_namespaces(policies.clone());
    if let Some(client) = client {
        admission = admission.with_cluster(Arc::new(Cluster::new(client)));
    }
    let budget = crate::budget::for_review(config.resolver.lookup_timeout);
    if is_single_object(&head) {
        let Some(Input::Object(document, _)) = head.into_iter().next() else {
            unreachable!("one object")
        };
        let reviewed = review_document(&admission, document, budget).await?;
        return write_one(out, &reviewed, args.json);
    }
    let mut found = Found::with_kinds(config.kinds.clone());
    let mut read = 0;
    let workloads = head.into_iter().chain(inputs).flat_map(|input| {
        match input {
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
        std::mem::take(&mut found.workloads)
    });
    let reports = if args.patch {
        let workloads: Vec<_> = workloads.collect();
        let outcomes = write_each(&admission, &workloads, budget, args.json, out).await?;
        nothing_read(read, &found)?;
        for unread in &found.unread {
            let _ = writeln!(std::io::stderr(), "skipped: {unread}");
        }
        let skipped_inputs = found.unread.len();
        return Ok(report::exit_status(outcomes, skipped_inputs, args.strict));
    } else {
        report::report_all(&admission, workloads, budget).await
    };
    nothing_read(read, &found)?;
    report::write(out, &reports, &found, args.json)?;
    let skipped_inputs = found.unread.len();
    Ok(report::exit_status(
        reports.iter().map(|r| r.outcome),
        skipped_inputs,
        args.strict,
    ))
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

/// One Pod or AdmissionReview (or one workload's Pod, with `--patch`), in detail.
fn write_one(
    out: &mut impl Write,
    reviewed: &DocumentAnswer,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // The object as it would be stored: the request's object with the patch applied.
    let mut patched = reviewed.object.clone();
    if !reviewed.answer.patch.is_empty() && reviewed.out.response.allowed {
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::to_value(&reviewed.answer.patch)?)?;
        json_patch::patch(&mut patched, &patch).context("applying the patch")?;
    }
    if json {
        write_json(out, reviewed, &patched)?;
    } else {
        write_text(out, reviewed, &patched)?;
    }
    Ok(report::exit_status([reviewed.answer.outcome()], 0, false))
}

/// `--patch` for several workloads: each one's Pod in detail, under a heading naming it.
async fn write_each(
    admission: &Admission,
    workloads: &[Workload],
    budget: Duration,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<Vec<Outcome>> {
    let reviews = workloads
        .iter()
        .map(|w| review_document(admission, w.pod.clone(), budget));
    let reviews = futures_util::future::join_all(reviews).await;
    let mut outcomes = Vec::new();
    // JSON: one array of what each workload's Pod shows, so the output is one JSON value.
    let mut buffered = Vec::new();
    for (workload, reviewed) in workloads.iter().zip(reviews) {
        let reviewed = reviewed?;
        if json {
            write_one(&mut buffered, &reviewed, true)?;
            buffered.push(b',');
        } else {
            writeln!(out, "# {} ({})", workload.label(), workload.source)?;
            write_one(out, &reviewed, false)?;
        }
        outcomes.push(reviewed.answer.outcome());
    }
    if json {
        buffered.pop();
        writeln!(out, "[{}]", String::from_utf8_lossy(&buffered))?;
    }
    Ok(outcomes)
}

fn write_json(
    out: &mut impl Write,
    reviewed: &DocumentAnswer,
    patched: &Value,
) -> anyhow::Result<()> {
    let response = &reviewed.out.response;
    let mut report = json!({
        "allowed": response.allowed,
        "outcome": reviewed.answer.outcome().label(),
        "summary": reviewed.answer.decision.summary(),
        "denied": response.status.as_ref().map(|s| &s.message),
        "warnings": response.warnings,
        "patch": reviewed.answer.patch,
        "pod": patched,
        "response": reviewed.out,
    });
    if !reviewed.lookup_causes.is_empty() {
        report["causes"] = json!(reviewed.lookup_causes);
    }
    serde_json::to_writer_pretty(&mut *out, &report)?;
    writeln!(out)?;
    Ok(())
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
    // Why a registry could not be reached: for the operator, never in the webhook's answer.
    for (image, cause) in &reviewed.lookup_causes {
        writeln!(out, "cause:    {image}: {cause}")?;
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
