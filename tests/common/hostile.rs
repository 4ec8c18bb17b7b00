//! A hostile registry written for the tests: plain http on 127.0.0.1, speaking as much of the
//! OCI distribution API as tolerable's client uses (manifest and blob GETs by tag or digest),
//! serving documents built to cost work — indexes that fan out, nest, invent platforms — and
//! bodies that stall. A real registry serves what is pushed to it and never stalls on purpose.
//! Every request is counted by path, so a test can say what one lookup cost.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{json, Value};

use super::fixtures::{sha256, OCI_CONFIG, OCI_INDEX, OCI_MANIFEST};

/// What a stalled body declares; it sends two bytes less, then nothing, and never ends.
pub const STALLED_BODY_BYTES: usize = 4 << 20;
/// Indexes (and images) in each level of `evil/nested*`: every index lists this many
/// platform-less children, all within the per-index limits (512 entries, depth 3).
pub const NESTED_WIDTH: usize = 64;
/// Platform-less children of `evil/stalled*`, each a manifest that stalls.
pub const STALLED_CHILDREN: usize = 16;
/// The invented architectures of `evil/labels`: 110 characters, no label value.
pub const INVENTED_ARCHITECTURES: usize = 64;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The registry; it runs until the test binary exits.
pub struct HostileRegistry {
    pub host: String,
    requests: Arc<Mutex<HashMap<String, usize>>>,
}

impl HostileRegistry {
    pub fn start() -> Self {
        let requests: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let counted = requests.clone();
        let documents = Arc::new(Documents::new());
        let port = super::serve(None, move |req: hyper::Request<hyper::body::Incoming>| {
            let path = req.uri().path().to_owned();
            *counted.lock().unwrap().entry(path.clone()).or_default() += 1;
            let response = documents.answer(&path);
            async move { response }
        });
        Self {
            host: format!("127.0.0.1:{port}"),
            requests,
        }
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.requests.lock().unwrap().values().sum()
    }

    /// Requests received for repository `repository`, by path.
    pub fn requests_for(&self, repository: &str) -> HashMap<String, usize> {
        let prefix = format!("/v2/{repository}/");
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(path, _)| path.starts_with(&prefix))
            .map(|(path, n)| (path.clone(), *n))
            .collect()
    }
}

/// A manifest or blob: its media type and body.
struct Document {
    media_type: &'static str,
    body: Bytes,
}

impl Document {
    fn json(media_type: &'static str, value: &Value) -> Self {
        Self {
            media_type,
            body: Bytes::from(value.to_string()),
        }
    }

    fn digest(&self) -> String {
        sha256(&self.body)
    }

    /// This document as an index entry, with `platform` when given.
    fn entry(&self, platform: Option<Value>) -> Value {
        let mut entry =
            json!({"mediaType": self.media_type, "digest": self.digest(), "size": self.body.len()});
        if let Some(platform) = platform {
            entry["platform"] = platform;
        }
        entry
    }
}

fn index(entries: Vec<Value>, note: &str) -> Document {
    Document::json(
        OCI_INDEX,
        &json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries, "annotations": {"note": note}}),
    )
}

fn config(architecture: &str, note: &str) -> Document {
    Document::json(
        OCI_CONFIG,
        &json!({"os": "linux", "architecture": architecture, "rootfs": {"type": "layers", "diff_ids": []}, "comment": note}),
    )
}

fn image(config_digest: &str, config_size: usize) -> Document {
    Document::json(
        OCI_MANIFEST,
        &json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
            "layers": [],
        }),
    )
}

/// Everything the registry serves: documents by digest, tags by repository, and the digests
/// whose bodies stall.
struct Documents {
    by_digest: HashMap<String, Document>,
    /// Repository name prefix → the manifest its tags name (any tag, any suffix: each test
    /// asks a repository of its own, so requests can be counted per lookup).
    tags: Vec<(&'static str, String)>,
    stalled: Vec<String>,
}

impl Documents {
    fn new() -> Self {
        let mut documents = Self {
            by_digest: HashMap::new(),
            tags: Vec::new(),
            stalled: Vec::new(),
        };
        let (child, _) = documents.arm64_image("ordinary");
        documents.tag("good/", &child);
        let entry = documents.by_digest[&child].entry(None);
        let platform = |architecture: String| json!({"os": "linux", "architecture": architecture});
        let fanout = index(vec![entry.clone(); 500], "fanout");
        documents.add_tagged("evil/fanout", fanout);
        documents.add_tagged("evil/huge", index(vec![entry.clone(); 5000], "huge"));
        let invented = (0..500).map(|i| {
            let mut e = entry.clone();
            e["platform"] = platform(format!("arch{i}"));
            e
        });
        documents.add_tagged("evil/platforms", index(invented.collect(), "platforms"));
        let long = (0..600).map(|_| {
            let mut e = entry.clone();
            e["platform"] = platform("amd64".into());
            e
        });
        documents.add_tagged("evil/long", index(long.collect(), "long"));
        documents.add_labels(&entry);
        documents.add_nested();
        documents.add_stalled();
        documents
    }

    fn add(&mut self, document: Document) -> String {
        let digest = document.digest();
        self.by_digest.insert(digest.clone(), document);
        digest
    }

    fn tag(&mut self, prefix: &'static str, digest: &str) {
        self.tags.push((prefix, digest.to_owned()));
    }

    fn add_tagged(&mut self, prefix: &'static str, document: Document) {
        let digest = self.add(document);
        self.tag(prefix, &digest);
    }

    /// An arm64 image (a manifest and its config, `note` making it distinct): the digests of
    /// both.
    fn arm64_image(&mut self, note: &str) -> (String, String) {
        let config = config("arm64", note);
        let size = config.body.len();
        let config_digest = self.add(config);
        (self.add(image(&config_digest, size)), config_digest)
    }

    /// `evil/labels*`: arm64, and 64 invented 110-character architectures.
    fn add_labels(&mut self, arm64: &Value) {
        let mut entries = vec![{
            let mut e = arm64.clone();
            e["platform"] = json!({"os": "linux", "architecture": "arm64"});
            e
        }];
        entries.extend((0..INVENTED_ARCHITECTURES).map(|i| {
            let mut e = arm64.clone();
            e["platform"] = json!({"os": "linux", "architecture": invented_architecture(i)});
            e
        }));
        self.add_tagged("evil/labels", index(entries, "labels"));
    }

    /// `evil/nested*`: an index of 64 indexes, each of the same 64 indexes, each of the same
    /// 64 images, none naming a platform. Every index is within its own limits; walked index by
    /// index, the tree costs 64³ image reads.
    fn add_nested(&mut self) {
        let images: Vec<Value> = (0..NESTED_WIDTH)
            .map(|i| {
                let (digest, _) = self.arm64_image(&format!("nested image {i}"));
                self.by_digest[&digest].entry(None)
            })
            .collect();
        let mut level = images;
        for depth in (0..2).rev() {
            level = (0..NESTED_WIDTH)
                .map(|i| {
                    let digest = self.add(index(level.clone(), &format!("depth {depth} #{i}")));
                    self.by_digest[&digest].entry(None)
                })
                .collect();
        }
        self.add_tagged("evil/nested", index(level, "top"));
    }

    /// `evil/stalled*`: an index of 16 platform-less children whose manifests stall;
    /// `evil/stallcfg*`: an image whose config blob stalls.
    fn add_stalled(&mut self) {
        let children: Vec<Value> = (0..STALLED_CHILDREN)
            .map(|i| {
                let digest = sha256(format!("stalled child {i}").as_bytes());
                self.stalled.push(digest.clone());
                json!({"mediaType": OCI_MANIFEST, "digest": digest, "size": STALLED_BODY_BYTES})
            })
            .collect();
        self.add_tagged("evil/stalled", index(children, "stalled"));
        let config_digest = stalled_config_digest();
        self.stalled.push(config_digest.clone());
        self.add_tagged("evil/stallcfg", image(&config_digest, STALLED_BODY_BYTES));
    }

    /// The answer to a GET of `path`: a manifest by tag or digest, a blob by digest, a body
    /// that stalls, or the registry's 404.
    fn answer(&self, path: &str) -> hyper::Response<Body> {
        let Some(rest) = path.strip_prefix("/v2/") else {
            return not_found();
        };
        let reference = rest.rsplit('/').next().unwrap_or_default();
        if self.stalled.iter().any(|d| d == reference) {
            return stalled();
        }
        if let Some(answer) = own_stalled_config(rest, reference) {
            return answer;
        }
        let digest = match self.by_digest.contains_key(reference) {
            true => Some(reference.to_owned()),
            false if rest.contains("/manifests/") => self
                .tags
                .iter()
                .find(|(prefix, _)| rest.starts_with(prefix))
                .map(|(_, digest)| digest.clone()),
            false => None,
        };
        let Some(document) = digest.as_ref().and_then(|d| self.by_digest.get(d)) else {
            return not_found();
        };
        let mut response = hyper::Response::new(Full::new(document.body.clone()).boxed_unsync());
        let headers = response.headers_mut();
        headers.insert("content-type", document.media_type.parse().unwrap());
        headers.insert("docker-content-digest", document.digest().parse().unwrap());
        response
    }
}

/// `evil/stallown*`: each repository an image of its own whose config blob (its own digest)
/// stalls — what an attacker re-posting fresh tags serves, so no two lookups share a blob.
fn own_stalled_config(rest: &str, reference: &str) -> Option<hyper::Response<Body>> {
    let (repository, kind) = rest
        .split_once("/manifests/")
        .map(|(repository, _)| (repository, "manifests"))
        .or_else(|| rest.split_once("/blobs/").map(|(r, _)| (r, "blobs")))?;
    if !repository.starts_with("evil/stallown") {
        return None;
    }
    let config_digest = sha256(format!("stalled config of {repository}").as_bytes());
    if kind == "blobs" {
        return Some(match reference == config_digest {
            true => stalled(),
            false => not_found(),
        });
    }
    let document = image(&config_digest, STALLED_BODY_BYTES);
    let mut response = hyper::Response::new(Full::new(document.body.clone()).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert("content-type", document.media_type.parse().unwrap());
    headers.insert("docker-content-digest", document.digest().parse().unwrap());
    Some(response)
}

/// The digest of the config blob of `evil/stallcfg*`, whose body stalls.
pub fn stalled_config_digest() -> String {
    sha256(b"stalled config")
}

/// The `i`th invented architecture: 110 characters, with a space (no label value).
pub fn invented_architecture(i: usize) -> String {
    format!("invented {i:04} {}", "x".repeat(96))
}

fn not_found() -> hyper::Response<Body> {
    let body = Full::new(Bytes::from_static(
        br#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#,
    ));
    let mut response = hyper::Response::new(body.boxed_unsync());
    *response.status_mut() = hyper::StatusCode::NOT_FOUND;
    response
}

/// Declares [`STALLED_BODY_BYTES`], sends two bytes less, and then nothing, forever.
fn stalled() -> hyper::Response<Body> {
    let chunk = Bytes::from(vec![b' '; 64 << 10]);
    let chunks = STALLED_BODY_BYTES / chunk.len();
    let frames = (0..chunks).map(move |i| {
        let data = match i + 1 == chunks {
            true => chunk.slice(..chunk.len() - 2),
            false => chunk.clone(),
        };
        Ok::<_, Infallible>(Frame::data(data))
    });
    let body = futures_util::stream::iter(frames).chain(futures_util::stream::pending());
    let mut response = hyper::Response::new(StreamBody::new(body).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert("content-type", OCI_MANIFEST.parse().unwrap());
    headers.insert("content-length", STALLED_BODY_BYTES.into());
    response
}
