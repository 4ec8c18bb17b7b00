//! The one fake API server (`common::kube_fake`) answers exactly as recorded: every exchange of
//! every recorded folder with an index (`tests/data/kube-api/index.json` — Nodes, Secrets,
//! ServiceAccounts, webhook configurations, the webhook-wire Pod creations —, `workloads/`,
//! `leases/`, `crashes/`), replayed over the wire with a real `kube` client, gets the recorded
//! status, `Content-Type`, framing, `Warning` headers and body byte for byte.

use bytes::Bytes;

use crate::common;
use common::kube_fake::{exchanges, Exchange, FakeApi};

/// What came back for one request: status, `Content-Type`, chunked or not, warnings, body.
#[derive(PartialEq)]
struct Seen {
    status: u16,
    content_type: Option<String>,
    chunked: bool,
    warnings: Vec<String>,
    body: Bytes,
}

/// The body's length and its start: a whole watch would drown the difference.
impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let start = &self.body[..self.body.len().min(160)];
        f.debug_struct("Seen")
            .field("status", &self.status)
            .field("content_type", &self.content_type)
            .field("chunked", &self.chunked)
            .field("warnings", &self.warnings)
            .field("body_len", &self.body.len())
            .field("body_start", &String::from_utf8_lossy(start))
            .finish()
    }
}

async fn send(port: u16, exchange: &Exchange) -> Seen {
    let client = common::kube_fake::client(port, exchange.token.as_deref().unwrap_or("admintoken"));
    let mut request = http::Request::builder()
        .method(exchange.method.as_str())
        .uri(&exchange.path_and_query);
    if let Some(content_type) = &exchange.request_content_type {
        request = request.header("content-type", content_type);
    }
    let body = exchange
        .request_body
        .as_ref()
        .map(|b| b.to_string().into_bytes())
        .unwrap_or_default();
    let request = request.body(kube::client::Body::from(body)).unwrap();
    let response = client.send(request).await.expect("the fake answers");
    let headers = response.headers();
    let text = |v: &http::HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
    Seen {
        status: response.status().as_u16(),
        content_type: headers.get("content-type").map(text),
        chunked: headers.get("content-length").is_none(),
        warnings: headers.get_all("warning").iter().map(text).collect(),
        body: response.into_body().collect_bytes().await.unwrap(),
    }
}

/// The recorded answer, as [`Seen`].
fn recorded(exchange: &Exchange) -> Seen {
    Seen {
        status: exchange.status,
        content_type: exchange.content_type.clone(),
        chunked: exchange.chunked,
        warnings: exchange.warnings.clone(),
        body: exchange.body.clone(),
    }
}

#[tokio::test]
async fn the_fake_api_server_answers_every_recorded_exchange_as_recorded() {
    let mut replayed = 0;
    for folder in ["", "workloads", "leases", "crashes"] {
        let api = FakeApi::new().recorded(folder).start();
        let recordings = exchanges(folder);
        assert!(!recordings.is_empty(), "{folder:?} has recordings");
        for exchange in &recordings {
            let seen = send(api.port, exchange).await;
            assert_eq!(seen, recorded(exchange), "{folder}/{}", exchange.name);
            replayed += 1;
        }
    }
    // 76 + 23 + 15 + 18: a recording dropped from an index is noticed.
    assert_eq!(replayed, 132);
}

/// A request no folder records is refused, not invented: 501 `NotImplemented`.
#[tokio::test]
async fn the_fake_api_server_refuses_an_unrecorded_request() {
    let api = FakeApi::new().recorded("").start();
    let client = api.client("admintoken");
    let (code, body) = common::recorded::send(
        &client,
        "GET",
        "/api/v1/namespaces/team-a/configmaps?",
        None,
        None,
    )
    .await;
    assert_eq!((code, &body["reason"]), (501, &"NotImplemented".into()));
}

/// Query pairs are matched parsed, not as the raw string: the recorded watch from 0 is found
/// with its parameters in another order and without kube's leading `&`.
#[tokio::test]
async fn the_fake_api_server_matches_query_pairs_in_any_order() {
    let api = FakeApi::new().recorded("").start();
    let exchange = exchanges("")
        .into_iter()
        .find(|e| e.name == "node-watch-rv-0")
        .unwrap();
    let (path, query) = exchange.path_and_query.split_once('?').unwrap();
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    pairs.reverse();
    let reordered = Exchange {
        path_and_query: format!("{path}?{}", pairs.join("&")),
        ..exchange.clone()
    };
    assert_eq!(send(api.port, &reordered).await, recorded(&exchange));
}

/// A handler is asked before the recordings and passes on what is not its own: here it keeps
/// `/version` (answering what no recording says), and the recorded Node list is still served
/// as recorded.
#[tokio::test]
async fn the_fake_api_server_asks_its_handlers_before_the_recordings() {
    let api = FakeApi::new()
        .recorded("")
        .handler(std::sync::Arc::new(|req: &common::kube_fake::Req| {
            let version = serde_json::json!({"gitVersion": "v0.0.0-handler"});
            let answer = (req.path == "/version").then(|| common::kube_fake::json(200, &version));
            answer.and_then(common::kube_fake::ready)
        }))
        .start();
    let recorded_list = exchanges("")
        .into_iter()
        .find(|e| e.name == "node-list")
        .unwrap();
    assert_eq!(
        send(api.port, &recorded_list).await,
        recorded(&recorded_list)
    );
    let version = Exchange {
        name: "version".into(),
        path_and_query: "/version".into(),
        ..recorded_list.clone()
    };
    let seen = send(api.port, &version).await;
    assert_eq!(seen.status, 200);
    assert_eq!(&seen.body[..], br#"{"gitVersion":"v0.0.0-handler"}"#);
}
