//! `tolerable review FILE|-`: the webhook's decision, offline, for a Pod manifest or an
//! AdmissionReview — for operators debugging and for CI pipelines.

use std::io::{Read as _, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::admission::review::{AdmissionReviewOut, PodObject, ADMISSION_V1};
use crate::admission::{self, Admission, Asked, PodAnswer};
use crate::cli::ReviewArgs;
use crate::config::Config;
use crate::mutate::{Answer, Outcome};
use crate::registry::Resolver;

/// Reads YAML or JSON: JSON first (exact), then YAML (a superset for these documents).
pub(crate) fn parse_document(text: &str) -> anyhow::Result<Value> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Ok(value);
    }
    serde_yaml_ng::from_str::<Value>(text).context("input is neither JSON nor YAML")
}

/// What `review` answers: the core's answer, the response as the webhook would send it, and
/// the object the patch applies to.
struct Reviewed {
    answer: Answer,
    out: AdmissionReviewOut,
    object: Value,
}

/// The webhook's answer for `document`: an AdmissionReview is answered as the webhook answers
/// it; a Pod manifest as a Pod CREATE in its namespace (else `default`).
async fn review_document(
    admission: &Admission,
    document: Value,
    budget: Duration,
) -> anyhow::Result<Reviewed> {
    match document.get("kind").and_then(Value::as_str) {
        Some("AdmissionReview") => {
            let body = serde_json::to_vec(&document)?;
            let reviewed = admission
                .review(&body, budget)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let object = document
                .pointer("/request/object")
                .cloned()
                .unwrap_or(Value::Null);
            Ok(Reviewed {
                answer: reviewed.answer,
                out: reviewed.out,
                object,
            })
        }
        Some("Pod") | None if document.get("spec").is_some() => {
            let PodAnswer {
                answer,
                shell_warnings,
            } = match PodObject::parse(&document.to_string()) {
                Err(reason) => Answer::invalid_object(&reason).into(),
                Ok(object) => match admission::read_pod(None, object, admission.policy()) {
                    Asked::Decide(pod, pull_secrets) => {
                        admission.answer(&pod, &pull_secrets, budget).await
                    }
                    Asked::Answered(answer) => answer.into(),
                },
            };
            let allowed = AdmissionReviewOut::allow_uid(ADMISSION_V1, REVIEW_UID);
            let out = admission::respond(allowed, &answer, &shell_warnings);
            Ok(Reviewed {
                answer,
                out,
                object: document,
            })
        }
        Some(other) => bail!("expected a Pod or an AdmissionReview, got kind {other}"),
        None => bail!("expected a Pod or an AdmissionReview (no kind, no spec)"),
    }
}

/// The uid of the response `review` shows for a Pod manifest (there is no request).
const REVIEW_UID: &str = "tolerable-review";

fn read_input(file: &str) -> anyhow::Result<String> {
    if file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        Ok(text)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file}"))
    }
}

pub(crate) async fn run(
    config: &Config,
    args: &ReviewArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let document = parse_document(&read_input(&args.file)?)?;
    let resolver = Arc::new(Resolver::new(
        config.resolver.clone(),
        config.credential_store()?,
    )?);
    let admission = Admission::new(resolver, config.policy.clone(), None);
    let budget = crate::budget::for_review(config.resolver.lookup_timeout);
    let reviewed = review_document(&admission, document, budget).await?;
    // The object as it would be stored: the request's object with the patch applied.
    let mut patched = reviewed.object.clone();
    if !reviewed.answer.patch.is_empty() && reviewed.out.response.allowed {
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::to_value(&reviewed.answer.patch)?)?;
        json_patch::patch(&mut patched, &patch).context("applying the patch")?;
    }
    if args.json {
        write_json(out, &reviewed, &patched)?;
    } else {
        write_text(out, &reviewed, &patched)?;
    }
    // One exit status per outcome: only a denial fails.
    Ok(match reviewed.answer.outcome() {
        Outcome::Denied => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    })
}

fn write_json(out: &mut impl Write, reviewed: &Reviewed, patched: &Value) -> anyhow::Result<()> {
    let response = &reviewed.out.response;
    let report = json!({
        "allowed": response.allowed,
        "outcome": reviewed.answer.outcome().label(),
        "summary": reviewed.answer.decision.summary(),
        "denied": response.status.as_ref().map(|s| &s.message),
        "warnings": response.warnings,
        "patch": reviewed.answer.patch,
        "pod": patched,
        "response": reviewed.out,
    });
    serde_json::to_writer_pretty(&mut *out, &report)?;
    writeln!(out)?;
    Ok(())
}

fn write_text(out: &mut impl Write, reviewed: &Reviewed, patched: &Value) -> anyhow::Result<()> {
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
