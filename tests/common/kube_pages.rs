//! Paged lists as kube-apiserver serves them, read off the recorded pages in
//! `tests/data/kube-api/workloads/` (README, "Things to know" 2 and 3): items in etcd key order
//! (`namespace/name`, or `name` for a cluster-scoped kind), at most `limit` of them, then a
//! `continue` token — base64url without padding of
//! `{"v":"meta.k8s.io/v1","rv":<the first page's revision>,"start":"<last key>\u0000"}` — and
//! `remainingItemCount`; the last page has neither key. Every page carries the first page's
//! revision as the list's `resourceVersion`. Used by the workloads fake for the requests no
//! recording answers (another page size, another namespace) and by the audit benchmark's
//! generated cluster; the tests check it reproduces the recorded pages byte for byte.

use base64::Engine as _;
use serde_json::Value;

/// What a list request asked, read from its query as kube-core writes it (`?&limit=3&…`).
#[derive(Debug, Default)]
pub struct ListQuery {
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    /// `labelSelector`'s `key=value` pairs (all must match).
    pub selector: Vec<(String, String)>,
}

/// Why the API server refuses a list request with 400 BadRequest (a continue token that is not
/// one, or one with a resourceVersion): its message. (A token whose revision was compacted is
/// the server's state, not the request's: see the workloads fake.)
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    BadRequest(String),
}

impl ListQuery {
    pub fn parse(query: &str) -> Result<Self, Refused> {
        let mut asked = Self::default();
        for (key, value) in super::kube_fake::query_pairs(query) {
            let value = value.as_str();
            match key.as_str() {
                "limit" => {
                    let limit: i64 = value.parse().map_err(|_| {
                        Refused::BadRequest(format!("limit: invalid value {value:?}"))
                    })?;
                    // The API server treats 0 and negative limits as none.
                    asked.limit = usize::try_from(limit).ok().filter(|n| *n > 0);
                }
                "continue" => asked.continue_token = Some(value.to_owned()),
                "resourceVersion" => asked.resource_version = Some(value.to_owned()),
                "labelSelector" => {
                    asked.selector = value
                        .split(',')
                        .filter_map(|pair| {
                            let (k, v) = pair.split_once('=')?;
                            Some((k.to_owned(), v.to_owned()))
                        })
                        .collect();
                }
                _ => {}
            }
        }
        if asked.continue_token.is_some()
            && asked
                .resource_version
                .as_deref()
                .is_some_and(|rv| !rv.is_empty())
        {
            return Err(Refused::BadRequest(
                "specifying resource version is not allowed when using continue".into(),
            ));
        }
        Ok(asked)
    }
}

/// A continue token: the revision of the list's first page, and the key it goes on after.
#[derive(Debug, PartialEq, Eq)]
pub struct Continue {
    pub revision: i64,
    pub after: String,
}

impl Continue {
    pub fn encode(&self) -> String {
        let start = serde_json::to_string(&format!("{}\0", self.after)).unwrap();
        let json = format!(
            r#"{{"v":"meta.k8s.io/v1","rv":{},"start":{start}}}"#,
            self.revision
        );
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    /// `Err` (400, with the API server's words) for anything that is not a token it wrote.
    pub fn decode(token: &str) -> Result<Self, Refused> {
        let invalid = |why: &str| {
            Refused::BadRequest(format!(
                "invalid continue token: continue key is not valid: {why}"
            ))
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|e| invalid(&e.to_string()))?;
        let json: Value = serde_json::from_slice(&bytes).map_err(|e| invalid(&e.to_string()))?;
        if json["v"] != "meta.k8s.io/v1" {
            return Err(invalid("unknown version"));
        }
        let revision = json["rv"].as_i64().ok_or_else(|| invalid("no rv"))?;
        let start = json["start"].as_str().ok_or_else(|| invalid("no start"))?;
        Ok(Self {
            revision,
            after: start.trim_end_matches('\0').to_owned(),
        })
    }
}

/// One page of `items` (each with its etcd key, in key order), after `after`, at most `limit`.
pub struct Page<'a, T> {
    pub items: &'a [(String, T)],
    /// The token for the next page and how many items remain, when some do.
    pub more: Option<(String, usize)>,
}

pub fn page<'a, T>(
    items: &'a [(String, T)],
    limit: Option<usize>,
    after: Option<&str>,
    revision: i64,
) -> Page<'a, T> {
    let start = after.map_or(0, |after| {
        items.partition_point(|(key, _)| key.as_str() <= after)
    });
    let rest = &items[start..];
    let n = limit.unwrap_or(rest.len()).min(rest.len());
    let more = (n < rest.len()).then(|| {
        let token = Continue {
            revision,
            after: rest[n - 1].0.clone(),
        };
        (token.encode(), rest.len() - n)
    });
    Page {
        items: &rest[..n],
        more,
    }
}

/// The list body of a page, as the API server writes it: `kind`, `apiVersion`, then
/// `metadata` (`resourceVersion`, `continue`, `remainingItemCount`), then `items`, compact,
/// ending with a newline. Items are JSON text already.
pub fn list_body(kind: &str, api_version: &str, revision: i64, page: &Page<'_, String>) -> String {
    let more = match &page.more {
        Some((token, remaining)) => {
            format!(r#","continue":"{token}","remainingItemCount":{remaining}"#)
        }
        None => String::new(),
    };
    let mut body = format!(
        r#"{{"kind":"{kind}","apiVersion":"{api_version}","metadata":{{"resourceVersion":"{revision}"{more}}},"items":["#
    );
    for (i, (_, item)) in page.items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(item);
    }
    body.push_str("]}\n");
    body
}

/// An item's etcd key: `namespace/name`, or `name` for a cluster-scoped kind.
pub fn key_of(item: &Value) -> String {
    let meta = &item["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    match meta["namespace"].as_str() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}
