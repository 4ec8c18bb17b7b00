//! `review`'s per-namespace policy: the cluster's Namespaces (one list, metadata only, with
//! `--kubeconfig` / `--context` / `--cluster`), then the command line's `--namespace-label` and
//! `--namespace-annotation` (which replace what the cluster said of that namespace), then each
//! Namespace in the input as it is read (for the workloads after it: `kubectl kustomize` and
//! `helm template` put Namespaces first). `[policy] namespace_policy = false` reads neither the
//! cluster's nor the input's; the command line's are always taken.

use std::collections::BTreeMap;
use std::io::Write as _;

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::cli::ReviewArgs;
use crate::cluster::namespaces::NamespacePolicies;
use crate::config::Config;
use crate::mutate::NamespacePolicy;

/// A namespace's labels and annotations as the command line gives them.
type Given = BTreeMap<String, (BTreeMap<String, String>, BTreeMap<String, String>)>;

/// The policies `review` decides with.
pub(super) async fn policies(
    config: &Config,
    args: &ReviewArgs,
    client: Option<&kube::Client>,
) -> anyhow::Result<NamespacePolicies> {
    let given = given(args)?;
    let listed = match client.filter(|_| config.namespace_policy) {
        Some(client) => match NamespacePolicies::list(client.clone()).await {
            Ok(listed) => Some(listed),
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: could not list namespaces ({e}): no namespace policy from the cluster"
                );
                None
            }
        },
        None => None,
    };
    let policies = listed.unwrap_or_else(|| NamespacePolicies::fixed([]));
    for (name, (labels, annotations)) in given {
        policies.set(
            &name,
            NamespacePolicy::from_metadata(Some(&labels), Some(&annotations)),
        );
    }
    Ok(policies)
}

/// `--namespace-label` and `--namespace-annotation`, each `NAMESPACE:KEY=VALUE`.
fn given(args: &ReviewArgs) -> anyhow::Result<Given> {
    let mut given = Given::new();
    for (flag, values, annotation) in [
        ("--namespace-label", &args.namespace_labels, false),
        ("--namespace-annotation", &args.namespace_annotations, true),
    ] {
        for value in values {
            let (namespace, key, text) = split(value)
                .with_context(|| format!("{flag} {value:?}: expected NAMESPACE:KEY=VALUE"))?;
            let (labels, annotations) = given.entry(namespace.to_owned()).or_default();
            let map = if annotation { annotations } else { labels };
            map.insert(key.to_owned(), text.to_owned());
        }
    }
    Ok(given)
}

/// `NAMESPACE:KEY=VALUE` (a namespace holds no `:`, a key no `=`; the value may hold both).
fn split(value: &str) -> anyhow::Result<(&str, &str, &str)> {
    let Some((namespace, rest)) = value.split_once(':') else {
        bail!("no ':' after the namespace");
    };
    let Some((key, text)) = rest.split_once('=') else {
        bail!("no '=' after the key");
    };
    if namespace.is_empty() || key.is_empty() {
        bail!("empty namespace or key");
    }
    Ok((namespace, key, text))
}

/// A Namespace in the input (or in a List): its policy is taken for the workloads read after
/// it.
pub(super) fn take_in(config: &Config, policies: &NamespacePolicies, document: &Value) {
    if !config.namespace_policy {
        return;
    }
    match document.get("kind").and_then(Value::as_str) {
        Some("Namespace") => take_namespace(policies, document),
        Some(kind) if kind.ends_with("List") => {
            let items = document.get("items").and_then(Value::as_array);
            for item in items.into_iter().flatten() {
                if item.get("kind").and_then(Value::as_str) == Some("Namespace") {
                    take_namespace(policies, item);
                }
            }
        }
        _ => {}
    }
}

fn take_namespace(policies: &NamespacePolicies, document: &Value) {
    let meta = &document["metadata"];
    let Some(name) = meta.get("name").and_then(Value::as_str) else {
        return;
    };
    let map = |field: &str| -> BTreeMap<String, String> {
        meta.get(field)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect()
    };
    let policy = NamespacePolicy::from_metadata(Some(&map("labels")), Some(&map("annotations")));
    policies.set(name, policy);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_key_value() {
        assert_eq!(
            split("batch:tolerable.io/preferred-architecture=arm64=80, amd64=20").unwrap(),
            (
                "batch",
                "tolerable.io/preferred-architecture",
                "arm64=80, amd64=20"
            )
        );
        assert_eq!(split("a:k=").unwrap(), ("a", "k", ""));
        for bad in ["tolerable.io/skip=true", "team-a:enforce", ":k=v", "a:=v"] {
            assert!(split(bad).is_err(), "{bad}");
        }
    }
}
