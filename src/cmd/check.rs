//! `tolerable check`: does the API server call tolerable and get its decision? Found as the API
//! server finds it — a server-side dry run of a Pod create in a namespace the webhook covers
//! (nothing is created) — and, when the Pod comes back without `tolerable.io/decision` or is
//! refused, the likely cause: not installed, no CA bundle, a namespace left out, an error the
//! API server names, else a webhook it cannot reach (port, NetworkPolicy, provider).

use std::io::Write;
use std::process::ExitCode;

use crate::cli::{CheckArgs, CHECK_DECIDING, CHECK_NOT_DECIDING};
use crate::cluster::check::{dry_run_create, webhook_facts, DryRun, WebhookFacts};
use crate::cluster::connect;

pub(crate) async fn run(args: &CheckArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let client = connect::client(args.cluster.choice())
        .await
        .map_err(anyhow::Error::msg)?;
    let dry_run = dry_run_create(&client, &args.namespace, &args.image).await?;
    let facts = match &dry_run {
        DryRun::Created { decision: Some(_) } => None,
        _ => Some(webhook_facts(&client, &args.webhook_configuration).await?),
    };
    let (namespace, name) = (&args.namespace, &args.webhook_configuration);
    let (deciding, message) = verdict(namespace, name, &dry_run, facts.as_ref());
    writeln!(out, "{message}")?;
    Ok(if deciding {
        CHECK_DECIDING
    } else {
        CHECK_NOT_DECIDING
    }
    .into())
}

/// Whether tolerable decided, and what to tell the operator: the decision, or the likely cause.
fn verdict(
    namespace: &str,
    name: &str,
    dry_run: &DryRun,
    facts: Option<&Option<WebhookFacts>>,
) -> (bool, String) {
    if let DryRun::Created {
        decision: Some(decision),
    } = dry_run
    {
        return (
            true,
            format!("reachable and deciding: a Pod in {namespace} got tolerable.io/decision: {decision}"),
        );
    }
    let Some(Some(facts)) = facts else {
        return (false, format!("not installed: no MutatingWebhookConfiguration {name}, so the API server calls no tolerable"));
    };
    if !facts.ca_bundle {
        let from = facts
            .inject_ca_from
            .as_deref()
            .unwrap_or("(no inject-ca-from annotation)");
        return (false, format!("caBundle: MutatingWebhookConfiguration {name} has no CA bundle, so the API server cannot verify tolerable (cert-manager's CA injector, from {from}: is it running, and does that Certificate exist?)"));
    }
    if facts.excluded_namespaces.iter().any(|n| n == namespace) {
        return (false, format!("selector: MutatingWebhookConfiguration {name} leaves namespace {namespace} out; check a namespace tolerable covers (-n)"));
    }
    match dry_run {
        DryRun::Refused { code, message } => (false, refused(*code, message)),
        _ => (false, format!("unreachable: the Pod in {namespace} came back without tolerable.io/decision, so the API server did not get an answer from tolerable and let the Pod through (failurePolicy Ignore): the port (GKE private clusters reach nodes on 443 and 10250 only), a NetworkPolicy (networkPolicy.webhookFrom), a control plane that cannot reach Pod addresses (EKS with an overlay CNI), or no ready Pod (docs/install.md, \"Provider notes\"); also a namespaceSelector, objectSelector or matchConditions that leave this Pod out")),
    }
}

/// The cause the API server's refusal names.
fn refused(code: u16, message: &str) -> String {
    let cause = if message.contains("x509") || message.contains("certificate") {
        "caBundle: the API server does not trust tolerable's certificate"
    } else if [
        "connection refused",
        "deadline exceeded",
        "i/o timeout",
        "no endpoints",
        "no route to host",
    ]
    .iter()
    .any(|m| message.contains(m))
    {
        "unreachable: the API server cannot reach tolerable (port, NetworkPolicy, provider, or no ready Pod)"
    } else if code == 403 {
        "forbidden: these credentials may not create Pods in that namespace (a dry run needs create)"
    } else if message.contains("failed calling webhook") {
        "webhook error: the API server called a webhook and failed"
    } else {
        "refused"
    };
    format!("{cause} — the API server answered {code}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(ca_bundle: bool, excluded: &[&str]) -> Option<WebhookFacts> {
        Some(WebhookFacts {
            ca_bundle,
            excluded_namespaces: excluded.iter().map(|n| (*n).to_owned()).collect(),
            inject_ca_from: Some("tolerable-system/tolerable-tls".into()),
        })
    }

    /// Each cause is named distinctly, the first that applies winning: the decision, no
    /// configuration, no CA bundle, the namespace left out, what a refusal says, else
    /// unreachable.
    #[test]
    fn each_cause_is_named() {
        let created = |decision: Option<&str>| DryRun::Created {
            decision: decision.map(str::to_owned),
        };
        let refused = |code, message: &str| DryRun::Refused {
            code,
            message: message.to_owned(),
        };
        let cases = [
            (created(Some("placed: arm64, amd64")), facts(true, &[]), true, "reachable and deciding"),
            (created(None), None, false, "not installed"),
            (created(None), facts(false, &[]), false, "caBundle: "),
            (created(None), facts(true, &["default"]), false, "selector: "),
            (created(None), facts(true, &["kube-system"]), false, "unreachable: "),
            (refused(500, "failed calling webhook \"pods.tolerable.io\": tls: failed to verify certificate: x509: certificate signed by unknown authority"), facts(true, &[]), false, "caBundle: the API server does not trust"),
            (refused(500, "failed calling webhook \"pods.tolerable.io\": Post \"https://tolerable.tolerable-system.svc:443/mutate?timeout=10s\": context deadline exceeded"), facts(true, &[]), false, "unreachable: the API server cannot reach"),
            (refused(403, "pods is forbidden: User \"nobody\" cannot create resource \"pods\""), facts(true, &[]), false, "forbidden: "),
        ];
        for (dry_run, facts, deciding, says) in cases {
            let (got, message) = verdict("default", "tolerable", &dry_run, Some(&facts));
            assert_eq!(got, deciding, "{message}");
            assert!(message.starts_with(says), "{says}: {message}");
        }
    }
}
