//! `tolerable review` over workloads: each one's images and platforms, the architectures they
//! share and what the webhook would add when the controller creates its Pods; a table for
//! people, JSON for machines, and an exit status a CI gate can use.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use crate::admission::wire::cut_warning;
use crate::engine::{Engine, LookupCauses, PodAnswer, WorkloadAnswer, WORKLOADS_AT_ONCE};
use crate::mutate::{explain, Decision, Outcome};
use crate::workload::{Found, Workload};

/// What `review` reports of one workload.
#[derive(Debug, Serialize)]
pub(super) struct WorkloadReport {
    kind: String,
    name: String,
    /// Which of the kind's Pod templates (`workerGroupSpecs[gpu]`), when it has several or
    /// keeps one elsewhere than `spec.template`.
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<String>,
    namespace: Option<String>,
    /// `file:document`.
    source: String,
    /// The line its document starts on.
    line: Option<usize>,
    /// What its manifest has that the API server would refuse, each with its line: the outcome
    /// is then `invalid_object` (the other images are still looked up and shown).
    problems: Vec<String>,
    /// Each image and its platforms (`linux/arm64/v8`), or why they are unknown.
    images: BTreeMap<String, ImageReport>,
    /// The architectures every image supports; `None` when some are unknown (or the Pod is
    /// skipped).
    architectures: Option<Vec<String>>,
    #[serde(serialize_with = "outcome_label")]
    pub(super) outcome: Outcome,
    summary: String,
    /// What the webhook would add to the Pods (tolerations, steering).
    adds: Vec<String>,
    /// Why it would be denied.
    denied: Option<String>,
    warnings: Vec<String>,
    /// Why lookups failed to reach their registry, per image (for the operator; the
    /// webhook's warnings stay terse).
    #[serde(skip_serializing_if = "LookupCauses::is_empty")]
    causes: LookupCauses,
    /// What `serve`'s crash watch learned of its images (read from the shared cache), left out
    /// as the webhook leaves it out: "learned: D does not run on A".
    #[serde(skip_serializing_if = "Vec::is_empty")]
    learned: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum ImageReport {
    Platforms(Vec<String>),
    Unknown(String),
}

fn outcome_label<S: serde::Serializer>(outcome: &Outcome, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(outcome.label())
}

/// Reviews the workloads a few at a time, each with its own budget: the same image in several
/// workloads is looked up once (the resolver's cache joins concurrent lookups of one image), and
/// no lookup spends its budget waiting for a turn behind hundreds of others.
/// `workloads` is read as the reviews go, so memory holds the reports and the few workloads under
/// review, not every workload's Pod.
pub(super) async fn report_all(
    engine: &Engine,
    workloads: impl Iterator<Item = Workload>,
    budget: Duration,
) -> Vec<WorkloadReport> {
    use futures_util::StreamExt as _;
    futures_util::stream::iter(workloads.map(|w| report_workload(engine, w, budget)))
        .buffered(WORKLOADS_AT_ONCE)
        .collect()
        .await
}

async fn report_workload(engine: &Engine, workload: Workload, budget: Duration) -> WorkloadReport {
    let WorkloadAnswer {
        answered: pod_answer,
        common: architectures,
        ..
    } = engine.answer_workload(workload.object, budget).await;
    let PodAnswer {
        answer,
        shell_warnings,
        facts,
        lookup_causes,
        learned,
    } = pod_answer;
    let images = facts
        .into_iter()
        .map(|(image, fact)| {
            let report = match fact {
                Ok(fact) => {
                    ImageReport::Platforms(fact.platforms.iter().map(|p| p.to_string()).collect())
                }
                Err(failure) => ImageReport::Unknown(failure.to_string()),
            };
            (image, report)
        })
        .collect();
    let adds = match &answer.decision {
        Decision::Placed(placement) => explain::additions(placement),
        _ => Vec::new(),
    };
    let warnings = answer
        .warnings()
        .iter()
        .chain(&shell_warnings)
        .map(|w| cut_warning(w));
    let mut report = WorkloadReport {
        kind: workload.kind,
        name: workload.name,
        part: workload.part,
        namespace: workload.namespace,
        source: workload.source,
        line: workload.line,
        problems: Vec::new(),
        images,
        architectures,
        outcome: answer.outcome(),
        summary: answer.decision.summary().to_owned(),
        adds,
        // What would be denied, under enforce = false too: review is a gate either way.
        denied: answer.decision.denial().map(str::to_owned),
        warnings: warnings.collect(),
        causes: lookup_causes,
        learned,
    };
    if !workload.problems.is_empty() {
        // The manifest itself is wrong: what its valid images are is still shown, but no
        // decision stands for a Pod the API server would refuse.
        report.outcome = Outcome::InvalidObject;
        report.architectures = None;
        report.adds.clear();
        report.denied = None;
        report.summary = workload.problems.join("; ");
        report.warnings = workload.problems.iter().map(|p| cut_warning(p)).collect();
        report.problems = workload.problems;
    }
    report
}

/// The exit status, a gate for a GitOps repository: 3 with `--strict` when inputs were
/// skipped, whatever else; else 1 (problems found) when any workload could not run anywhere its
/// images do, would be denied, or is invalid; else 4 when images could not be looked up; else
/// 0. (2, could not run, is `main`'s for an error.)
pub(super) fn exit_status(
    outcomes: impl IntoIterator<Item = Outcome>,
    skipped_inputs: usize,
    strict: bool,
) -> ExitCode {
    let outcomes: Vec<Outcome> = outcomes.into_iter().collect();
    if strict && skipped_inputs > 0 {
        // Whatever else happened: a gate that accepts 1 or 4 (problems it knows of, images
        // it could not look up) must still see that inputs went unread.
        return crate::cli::REVIEW_SKIPPED_INPUTS.into();
    }
    let failed = outcomes.iter().any(|o| {
        matches!(
            o,
            Outcome::NoCommonArchitecture | Outcome::Denied | Outcome::InvalidObject
        )
    });
    if failed {
        ExitCode::FAILURE
    } else if outcomes
        .iter()
        .any(|o| matches!(o, Outcome::LookupFailed | Outcome::Gated))
    {
        // A gated Pod is one whose images could not be looked up: not checked either.
        crate::cli::REVIEW_LOOKUPS_FAILED.into()
    } else {
        ExitCode::SUCCESS
    }
}

pub(super) fn write(
    out: &mut impl Write,
    reports: &[WorkloadReport],
    found: &Found,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        let report = serde_json::json!({
            "workloads": reports,
            "skipped": found.skipped.iter().map(|s| serde_json::json!({
                "kind": s.kind, "name": s.name, "source": s.source,
            })).collect::<Vec<_>>(),
            "skipped_inputs": found.unread.iter().map(|u| serde_json::json!({
                "source": u.place.source(), "file": u.place.file,
                "document": u.place.document, "line": u.place.line, "reason": u.reason,
            })).collect::<Vec<_>>(),
            "summary": summary(reports, found),
        });
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
        return Ok(());
    }
    write_table(out, reports)?;
    for report in reports {
        for warning in report.warnings.iter().chain(&report.denied) {
            writeln!(out, "warning: {}: {warning}", label(report))?;
        }
        for learned in &report.learned {
            writeln!(out, "{}: {learned}", label(report))?;
        }
        // Why a registry could not be reached: on standard error, beside the exit status.
        for (image, cause) in &report.causes {
            let _ = writeln!(
                std::io::stderr(),
                "cause: {}: {image}: {cause}",
                label(report)
            );
        }
    }
    for unread in &found.unread {
        writeln!(out, "skipped: {unread}")?;
    }
    writeln!(out, "{}", summary(reports, found))?;
    Ok(())
}

fn label(report: &WorkloadReport) -> String {
    let label = crate::workload::label(&report.kind, report.namespace.as_deref(), &report.name);
    match &report.part {
        Some(part) => format!("{label} ({part})"),
        None => label,
    }
}

/// `WORKLOAD  SOURCE  ARCHITECTURES  OUTCOME  WOULD ADD`, columns as wide as their widest cell.
fn write_table(out: &mut impl Write, reports: &[WorkloadReport]) -> std::io::Result<()> {
    let rows: Vec<[String; 5]> = reports
        .iter()
        .map(|r| {
            let architectures = crate::cmd::architectures_cell(r.architectures.as_deref());
            let adds = if r.adds.is_empty() {
                "-".to_owned()
            } else {
                r.adds.join("; ")
            };
            [
                label(r),
                r.source.clone(),
                architectures,
                r.outcome.label().to_owned(),
                adds,
            ]
        })
        .collect();
    crate::cmd::write_table(
        out,
        [
            "WORKLOAD",
            "SOURCE",
            "ARCHITECTURES",
            "OUTCOME",
            "WOULD ADD",
        ],
        &rows,
    )
}

/// `3 workloads: 2 decided, 1 no_common_architecture; 1 object without a Pod template skipped;
/// 2 inputs skipped`.
fn summary(reports: &[WorkloadReport], found: &Found) -> String {
    let skipped = &found.skipped;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for report in reports {
        *counts.entry(report.outcome.label()).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(o, n)| format!("{n} {o}")).collect();
    let mut line = format!(
        "{} workload{}",
        reports.len(),
        if reports.len() == 1 { "" } else { "s" }
    );
    if !counts.is_empty() {
        let _ = write!(line, ": {}", counts.join(", "));
    }
    if !skipped.is_empty() {
        let _ = write!(
            line,
            "; {} object{} without a Pod template skipped",
            skipped.len(),
            if skipped.len() == 1 { "" } else { "s" }
        );
    }
    let unread = found.unread.len();
    if unread > 0 {
        let s = if unread == 1 { "" } else { "s" };
        let _ = write!(line, "; {unread} input{s} skipped (not reviewed)");
    }
    line
}
