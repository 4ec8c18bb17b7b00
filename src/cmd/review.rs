//! `tolerable review FILE|-`: the webhook's decision, offline, for a Pod manifest or an
//! AdmissionReview — for operators debugging and for CI pipelines.

use std::io::{Read as _, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::admission::Admission;
use crate::cli::ReviewArgs;
use crate::config::Config;
use crate::registry::Resolver;

/// Reads YAML or JSON: JSON first (exact), then YAML (a superset for these documents).
pub fn parse_document(text: &str) -> anyhow::Result<Value> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Ok(value);
    }
    serde_yaml_ng::from_str::<Value>(text).context("input is neither JSON nor YAML")
}

/// An AdmissionReview body for `document`: itself if it is one, else a Pod CREATE around it.
pub fn review_body(document: &Value) -> anyhow::Result<Vec<u8>> {
    match document.get("kind").and_then(Value::as_str) {
        Some("AdmissionReview") => Ok(serde_json::to_vec(document)?),
        Some("Pod") | None if document.get("spec").is_some() => {
            let namespace = document
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default");
            Ok(serde_json::to_vec(&json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "tolerable-review",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": namespace,
                    "operation": "CREATE",
                    "object": document,
                    "dryRun": true,
                },
            }))?)
        }
        Some(other) => bail!("expected a Pod or an AdmissionReview, got kind {other}"),
        None => bail!("expected a Pod or an AdmissionReview (no kind, no spec)"),
    }
}

pub async fn run(
    config: &Config,
    args: &ReviewArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let text = if args.file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file))?
    };
    let document = parse_document(&text)?;
    let body = review_body(&document)?;
    let resolver = Arc::new(Resolver::new(
        config.resolver.clone(),
        config.credential_store()?,
    )?);
    let admission = Admission::new(resolver, config.policy.clone(), None);
    let reviewed = admission
        .review(
            &body,
            config.resolver.lookup_timeout + Duration::from_millis(500),
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    // The object as it would be stored: the request's object with the patch applied.
    let object = match document.get("kind").and_then(Value::as_str) {
        Some("AdmissionReview") => document
            .pointer("/request/object")
            .cloned()
            .unwrap_or(Value::Null),
        _ => document.clone(),
    };
    let mut patched = object;
    if !reviewed.operations.is_empty() && reviewed.out.response.allowed {
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::to_value(&reviewed.operations)?)?;
        json_patch::patch(&mut patched, &patch).context("applying the patch")?;
    }
    let response = &reviewed.out.response;
    let summary = reviewed
        .decision
        .as_ref()
        .map_or("", |d| d.summary.as_str());
    if args.json {
        let report = json!({
            "allowed": response.allowed,
            "outcome": reviewed.outcome,
            "summary": summary,
            "denied": response.status.as_ref().map(|s| &s.message),
            "warnings": response.warnings,
            "patch": reviewed.operations,
            "pod": patched,
            "response": reviewed.out,
        });
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "decision: {}",
            if response.allowed {
                "allowed"
            } else {
                "denied"
            }
        )?;
        writeln!(out, "outcome:  {}", reviewed.outcome)?;
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
            serde_json::to_string_pretty(&reviewed.operations)?
        )?;
        if response.allowed {
            writeln!(
                out,
                "\n# Patched Pod\n{}",
                serde_yaml_ng::to_string(&patched)?
            )?;
        }
    }
    Ok(if response.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
