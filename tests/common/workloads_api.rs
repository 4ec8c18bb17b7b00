//! A thin fake of the Kubernetes API server for `tolerable audit`: HTTPS on 127.0.0.1 serving the
//! list responses recorded from a real kube-apiserver v1.26 in `tests/data/kube-api/workloads/`
//! (a mixed cluster: amd64, arm64 and s390x nodes; Deployments, a StatefulSet, a DaemonSet with a
//! crash-looping Pod on s390x, Jobs, a CronJob, a bare Pod). The recorded image host
//! `registry.test:5000` is replaced by this run's test registry. A namespaced list, a label
//! selector and a ServiceAccount GET are answered from the recorded cluster-wide lists, as the
//! API server would; `nobodytoken` gets the recorded 403.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::kube_api::{self, status as respond};

pub struct WorkloadsApi {
    pub port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

fn recording(name: &str, registry_host: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kube-api/workloads")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("registry.test:5000", registry_host)
}

fn not_found(what: &str) -> Response<Full<Bytes>> {
    respond(
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("{what} not found"), "reason": "NotFound", "code": 404})
        .to_string(),
    )
}

/// The recorded cluster-wide list of `plural`.
fn list_file(plural: &str) -> Option<&'static str> {
    Some(match plural {
        "deployments" => "deployment-list.body.json",
        "statefulsets" => "statefulset-list.body.json",
        "daemonsets" => "daemonset-list.body.json",
        "replicasets" => "replicaset-list.body.json",
        "jobs" => "job-list.body.json",
        "cronjobs" => "cronjob-list.body.json",
        "pods" => "pod-list.body.json",
        "nodes" => "node-list.body.json",
        "serviceaccounts" => "sa-list.body.json",
        _ => return None,
    })
}

/// `app%3Dweb,tier%3Dfront` → the label pairs an item must carry.
fn selector(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|p| p.strip_prefix("labelSelector="))
        .flat_map(|s| {
            s.replace("%3D", "=")
                .replace("%2C", ",")
                .split(',')
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Items per page at most, whatever `limit` asks: an API server may return fewer items than
/// asked, with a `continue` token, and the client must follow it (the recorded pages show the
/// shape: `continue` while more remain, no key at all on the last page).
const PAGE: usize = 3;

/// The recorded list, narrowed to `namespace` and the selector's labels, one page of it when
/// `limit` is asked (`continue` is the offset of the next page).
fn list(plural: &str, namespace: Option<&str>, query: &str, host: &str) -> Option<String> {
    let mut list: Value = serde_json::from_str(&recording(list_file(plural)?, host)).unwrap();
    let wanted = selector(query);
    let items = list["items"].as_array_mut().unwrap();
    items.retain(|item| {
        let meta = &item["metadata"];
        namespace.is_none_or(|ns| meta["namespace"] == ns)
            && wanted.iter().all(|(k, v)| meta["labels"][k] == v.as_str())
    });
    if query.split('&').any(|p| p.starts_with("limit=")) {
        let start: usize = query
            .split('&')
            .find_map(|p| p.strip_prefix("continue="))
            .map_or(0, |offset| offset.parse().unwrap());
        let rest = items.split_off(start.min(items.len()));
        let more = rest.len() > PAGE;
        *items = rest.into_iter().take(PAGE).collect();
        if more {
            list["metadata"]["continue"] = json!((start + PAGE).to_string());
        }
    }
    Some(list.to_string())
}

/// A ServiceAccount by name, from the recorded list (a GET by name carries kind and apiVersion).
fn service_account(namespace: &str, name: &str, host: &str) -> Response<Full<Bytes>> {
    let list: Value = serde_json::from_str(&recording("sa-list.body.json", host)).unwrap();
    let found = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|sa| sa["metadata"]["namespace"] == namespace && sa["metadata"]["name"] == name);
    match found {
        Some(sa) => {
            let mut sa = sa.clone();
            sa["kind"] = json!("ServiceAccount");
            sa["apiVersion"] = json!("v1");
            respond(StatusCode::OK, sa.to_string())
        }
        None => not_found(&format!("serviceaccounts \"{name}\"")),
    }
}

fn answer(path: &str, query: &str, token: Option<&str>, host: &str) -> Response<Full<Bytes>> {
    match token {
        Some("admintoken") => {}
        Some("nobodytoken") => {
            return respond(
                StatusCode::FORBIDDEN,
                recording("deployment-list-403.body.json", host),
            )
        }
        _ => return respond(StatusCode::UNAUTHORIZED, "{}".into()),
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (namespace, rest) = match parts[..] {
        ["api", "v1", "namespaces", ns, ref rest @ ..] => (Some(ns), rest),
        ["apis", _, _, "namespaces", ns, ref rest @ ..] => (Some(ns), rest),
        ["api", "v1", ref rest @ ..] | ["apis", _, _, ref rest @ ..] => (None, rest),
        _ => return not_found(path),
    };
    match (namespace, rest) {
        (Some(ns), ["serviceaccounts", name]) => service_account(ns, name, host),
        (Some(_), ["secrets", name]) => not_found(&format!("secrets \"{name}\"")),
        (namespace, [plural]) => match list(plural, namespace, query, host) {
            Some(body) => respond(StatusCode::OK, body),
            None => not_found(path),
        },
        _ => not_found(path),
    }
}

impl WorkloadsApi {
    pub fn start(registry_host: &str) -> Self {
        super::init();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let host = Arc::new(registry_host.to_owned());
        let port = super::serve(
            Some(kube_api::api_tls()),
            move |req: hyper::Request<hyper::body::Incoming>| {
                let path = req.uri().path().to_owned();
                let query = req.uri().query().unwrap_or("").to_owned();
                seen.lock().unwrap().push(format!("{path}?{query}"));
                let token = kube_api::bearer_token(&req);
                let host = host.clone();
                async move { answer(&path, &query, token.as_deref(), &host) }
            },
        );
        Self { port, requests }
    }

    /// A kubeconfig for this server with `token`.
    pub fn kubeconfig(&self, token: &str) -> tempfile::NamedTempFile {
        kube_api::kubeconfig(self.port, token)
    }

    /// Paths (with queries) requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}
