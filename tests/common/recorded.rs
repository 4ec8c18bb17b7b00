//! Replaying exchanges recorded from a real kube-apiserver against a fake, for each fake's
//! conformance test: [`send`] puts one recorded request on the wire with a real `kube` client,
//! and [`Ids`] pairs what each server makes up (uids, resourceVersions) so a fake's answer can
//! be compared with the recorded one field for field.

use std::collections::BTreeMap;

use serde_json::Value;

/// One recorded exchange of an `exchanges.json` folder (`crashes/`), as JSON values.
#[derive(Debug)]
pub struct Exchange {
    pub note: String,
    pub request: Request,
    pub response: Answer,
}

#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub content_type: Option<String>,
    pub body: Option<Value>,
}

#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// The exchanges recorded in `tests/data/kube-api/FOLDER/exchanges.json`, in order, as read by
/// the one fake's loader (`kube_fake::exchanges`).
pub fn exchanges(folder: &str) -> Vec<Exchange> {
    super::kube_fake::exchanges(folder)
        .into_iter()
        .map(|e| Exchange {
            note: e.name,
            request: Request {
                method: e.method,
                path: e.path_and_query,
                content_type: e.request_content_type,
                body: e.request_body,
            },
            response: Answer {
                status: e.status,
                body: match e.chunked {
                    true => Value::Array(json_lines(&e.body)),
                    false => serde_json::from_slice(&e.body).unwrap_or(Value::Null),
                },
            },
        })
        .collect()
}

/// Sends one request as `kube` would and returns the status and the body as JSON (`Null` for
/// an empty body).
pub async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let (code, bytes) = send_raw(client, method, path, content_type, body).await;
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{code} answer is not JSON ({e}): {bytes:?}"))
    };
    (code, body)
}

/// [`send`], the answer's body as sent (a watch's lines, say).
pub async fn send_raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<&Value>,
) -> (u16, bytes::Bytes) {
    let mut request = http::Request::builder().method(method).uri(path);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let request = request.body(kube::client::Body::from(bytes)).unwrap();
    let response = client.send(request).await.expect("the fake answers");
    let code = response.status().as_u16();
    (code, response.into_body().collect_bytes().await.unwrap())
}

/// A JSON body, or a watch's JSON lines, as values (an empty body: none).
pub fn json_lines(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).unwrap();
    let whole = serde_json::from_str::<Value>(text);
    match whole {
        Ok(value) => vec![value],
        Err(_) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect(),
    }
}

/// The values the recording's server made up paired with the fake's (a uid, a
/// resourceVersion): each pairing must hold for the whole replay, one to one.
#[derive(Default)]
pub struct Ids {
    to_recorded: BTreeMap<String, String>,
    to_fake: BTreeMap<String, String>,
}

impl Ids {
    /// Pairs `fake` with `recorded`; panics if either is already paired with another value.
    pub fn pair(&mut self, fake: &str, recorded: &str) {
        let was = self
            .to_recorded
            .insert(fake.to_owned(), recorded.to_owned());
        assert!(
            was.is_none_or(|r| r == recorded),
            "fake {fake} stands for two recorded values"
        );
        let was = self.to_fake.insert(recorded.to_owned(), fake.to_owned());
        assert!(
            was.is_none_or(|f| f == fake),
            "recorded {recorded} answered as two fake values"
        );
    }

    /// The fake's value for a recorded one (a recorded value never seen passes unchanged, e.g.
    /// a malformed resourceVersion).
    pub fn fake(&self, recorded: &str) -> String {
        self.to_fake
            .get(recorded)
            .cloned()
            .unwrap_or_else(|| recorded.to_owned())
    }

    /// Pairs the string at `pointer` in `fake` with the one in `recorded` and writes the
    /// recorded one into `fake`; both must be there or neither.
    pub fn align(&mut self, fake: &mut Value, recorded: &Value, pointer: &str) {
        match (fake.pointer(pointer), recorded.pointer(pointer)) {
            (Some(Value::String(f)), Some(Value::String(r))) => {
                let r = r.clone();
                self.pair(&f.clone(), &r);
                *fake.pointer_mut(pointer).unwrap() = Value::String(r);
            }
            (None, None) => {}
            (f, r) => panic!("{pointer}: the fake has {f:?}, the recording {r:?}"),
        }
    }
}
