//! What `tolerable check` asks the API server: a server-side dry run of a Pod create (the API
//! server calls its admission webhooks as for a real create, then stores nothing), and the
//! facts of tolerable's MutatingWebhookConfiguration that say why it might not be called.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use crate::mutate::DECISION_ANNOTATION;

/// The API server's answer to the dry run.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DryRun {
    /// It would have created the Pod; tolerable's decision annotation, if the Pod carries it.
    Created { decision: Option<String> },
    /// It refused (a webhook failing closed, a denial, RBAC): the status code and message.
    Refused { code: u16, message: String },
}

/// The dry run of a Pod named `tolerable-check-…` running `image` in `namespace`.
pub(crate) async fn dry_run_create(
    client: &kube::Client,
    namespace: &str,
    image: &str,
) -> Result<DryRun, kube::Error> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": "tolerable-check-",
                     "labels": {"app.kubernetes.io/name": "tolerable-check"}},
        "spec": {"containers": [{"name": "check", "image": image}]},
    }))
    .map_err(kube::Error::SerdeError)?;
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&params, &pod)
        .await
    {
        Ok(created) => Ok(DryRun::Created {
            decision: created
                .metadata
                .annotations
                .and_then(|a| a.get(DECISION_ANNOTATION).cloned()),
        }),
        Err(kube::Error::Api(status)) => Ok(DryRun::Refused {
            code: status.code,
            message: status.message,
        }),
        Err(e) => Err(e),
    }
}

/// What a webhook configuration says about whether the API server can call tolerable.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct WebhookFacts {
    /// A CA bundle is set (cert-manager's injector, or the chart, filled it in).
    pub(crate) ca_bundle: bool,
    /// The namespaces its namespaceSelector leaves out by name (`kubernetes.io/metadata.name
    /// NotIn`).
    pub(crate) excluded_namespaces: Vec<String>,
    /// cert-manager's `inject-ca-from` annotation, when set.
    pub(crate) inject_ca_from: Option<String>,
}

/// The facts of the MutatingWebhookConfiguration `name`, or `None` when there is none.
pub(crate) async fn webhook_facts(
    client: &kube::Client,
    name: &str,
) -> Result<Option<WebhookFacts>, kube::Error> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(config) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let webhooks = config.webhooks.unwrap_or_default();
    let ca_bundle = webhooks.iter().any(|w| {
        w.client_config
            .ca_bundle
            .as_ref()
            .is_some_and(|b| !b.0.is_empty())
    });
    let excluded_namespaces = webhooks
        .iter()
        .filter_map(|w| w.namespace_selector.as_ref()?.match_expressions.as_ref())
        .flatten()
        .filter(|e| e.key == "kubernetes.io/metadata.name" && e.operator == "NotIn")
        .flat_map(|e| e.values.clone().unwrap_or_default())
        .collect();
    let inject_ca_from = config
        .metadata
        .annotations
        .and_then(|a| a.get("cert-manager.io/inject-ca-from").cloned());
    Ok(Some(WebhookFacts {
        ca_bundle,
        excluded_namespaces,
        inject_ca_from,
    }))
}
