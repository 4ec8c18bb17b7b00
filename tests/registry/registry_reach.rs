//! What a Pod author or a hostile registry can make tolerable contact, and what comes back.
//!
//! Hostile registries are small servers written for the tests (a real registry cannot be made
//! to redirect to an internal address or name a hostile realm); "other hosts" are other loopback
//! addresses (127.0.0.2, 127.0.0.3), and "internal services" are servers on them whose answers
//! carry secrets that must never reach an error or a warning. Nothing leaves loopback.

use crate::common;

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

use common::certs::{self, Leaf};
use common::fixtures::{sha256, OCI_CONFIG, OCI_MANIFEST};
use common::registry;
use common::webhook::{self, recorded, TestServer};
use tolerable::registry::access::{AccessRules, LINK_LOCAL};
use tolerable::registry::cache::CacheSettings;
use tolerable::registry::client::TransportSettings;
use tolerable::registry::{
    BreakerSettings, Credential, CredentialStore, LookupError, Resolver, ResolverSettings,
};

/// What an internal service answers: must never be seen outside tolerable.
const SECRET: &str = "AKIA-INTERNAL-SECRET-7731";

const CONFIG: &[u8] =
    br#"{"architecture":"arm64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;

fn manifest() -> Vec<u8> {
    json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256(CONFIG), "size": CONFIG.len()},
        "layers": [],
    })
    .to_string()
    .into_bytes()
}

const LOCAL_2: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const LOCAL_3: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// A request a test server received.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    authorization: Option<String>,
}

/// A small server on a loopback address that records every request.
struct Server {
    /// `ip:port`.
    host: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    fn start(
        ip: Ipv4Addr,
        tls: Option<tokio_rustls::TlsAcceptor>,
        answer: impl Fn(&Request<hyper::body::Incoming>) -> Response<Full<Bytes>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        common::init();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let port = common::serve_on(ip, tls, move |req| {
            log.lock().unwrap().push(Seen {
                path: req.uri().to_string(),
                authorization: req
                    .headers()
                    .get("authorization")
                    .map(|v| v.to_str().unwrap_or("?").to_owned()),
            });
            let response = answer(&req);
            async move { response }
        });
        Self {
            host: format!("{ip}:{port}"),
            seen,
        }
    }

    /// An https server with a certificate from the test CA.
    fn https(
        ip: Ipv4Addr,
        answer: impl Fn(&Request<hyper::body::Incoming>) -> Response<Full<Bytes>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        let leaf = certs::ca().leaf(&["localhost", "127.0.0.1", "127.0.0.2", "127.0.0.3"]);
        Self::start(ip, Some(acceptor(&leaf)), answer)
    }

    fn http(
        ip: Ipv4Addr,
        answer: impl Fn(&Request<hyper::body::Incoming>) -> Response<Full<Bytes>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self::start(ip, None, answer)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn port(&self) -> u16 {
        self.host.rsplit_once(':').unwrap().1.parse().unwrap()
    }
}

fn acceptor(leaf: &Leaf) -> tokio_rustls::TlsAcceptor {
    let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

fn answer(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    response
}

fn redirect(location: String) -> Response<Full<Bytes>> {
    let mut response = answer(307, "text/plain", "");
    response
        .headers_mut()
        .insert("location", location.parse().unwrap());
    response
}

/// An internal service: every request gets a 500 whose body is a secret.
fn internal(ip: Ipv4Addr, tls: bool) -> Server {
    let secret = |_: &Request<hyper::body::Incoming>| {
        answer(
            500,
            "application/json",
            format!(
                r#"{{"Code":"Success","AccessKeyId":"{SECRET}","SecretAccessKey":"{SECRET}"}}"#
            ),
        )
    };
    if tls {
        Server::https(ip, secret)
    } else {
        Server::http(ip, secret)
    }
}

/// Resolver settings for these tests: the test CA trusted, `insecure` spoken to over http, and
/// `deny` added to the default denylist.
fn settings(insecure: &[&str], deny: &[&str]) -> ResolverSettings {
    common::init();
    let deny: Vec<String> = LINK_LOCAL
        .iter()
        .chain(deny)
        .map(|s| (*s).to_owned())
        .collect();
    ResolverSettings {
        transport: TransportSettings {
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(3),
            insecure_registries: insecure.iter().map(|s| (*s).to_owned()).collect(),
            extra_roots_pem: vec![certs::ca().ca_pem.clone().into_bytes()],
            access: AccessRules::new(&[], &deny).unwrap(),
        },
        mirrors: Default::default(),
        lookup_timeout: Duration::from_secs(3),
        cache: CacheSettings {
            tag_ttl: Duration::from_secs(60),
            digest_ttl: Duration::from_secs(600),
            failure_ttl: Duration::from_millis(10),
            stale_ttl: Duration::ZERO,
            max_entries: 100,
        },
        breaker: BreakerSettings {
            failures: 0,
            cooldown: Duration::from_secs(1),
        },
        shared_cache: None,
    }
}

async fn lookup_error(settings: ResolverSettings, image: &str) -> LookupError {
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();
    resolver
        .resolve(image)
        .await
        .map(|found| panic!("{image}: expected an error, found {found:?}"))
        .unwrap_err()
}

fn assert_no_secret(err: &LookupError) {
    let shown = format!("{err} | {}", err.reason());
    assert!(!shown.contains(SECRET), "the secret came back: {shown}");
}

#[tokio::test]
async fn a_redirect_from_https_to_http_is_not_followed() {
    let imds = internal(Ipv4Addr::LOCALHOST, false);
    let location = format!("http://{}/latest/meta-data/iam", imds.host);
    let registry = Server::https(Ipv4Addr::LOCALHOST, move |_| redirect(location.clone()));
    // Even to a host listed as insecure: https never goes down to http.
    let err = lookup_error(
        settings(&[&imds.host], &[]),
        &format!("{}/app:v1", registry.host),
    )
    .await;
    assert!(matches!(err, LookupError::NotAllowed { .. }), "{err:?}");
    assert!(err.to_string().contains("plain http"), "{err}");
    assert_no_secret(&err);
    assert!(imds.seen().is_empty(), "followed: {:?}", imds.seen());
    assert_eq!(registry.seen().len(), 1);
}

#[tokio::test]
async fn a_redirect_to_a_denied_address_is_not_followed() {
    let inside = internal(LOCAL_2, true);
    let location = format!("https://{}/v2/app/manifests/v1", inside.host);
    let registry = Server::https(Ipv4Addr::LOCALHOST, move |_| redirect(location.clone()));
    let err = lookup_error(
        settings(&[], &["127.0.0.2/32"]),
        &format!("{}/app:v1", registry.host),
    )
    .await;
    assert!(matches!(err, LookupError::NotAllowed { .. }), "{err:?}");
    assert!(err.to_string().contains("registry_denylist"), "{err}");
    assert_no_secret(&err);
    assert!(inside.seen().is_empty(), "followed: {:?}", inside.seen());
}

/// A name that resolves to a denied address is refused at connect time, like the address: the
/// redirect names `localhost`, which passes every rule as written.
#[tokio::test]
async fn a_redirect_to_a_name_resolving_to_a_denied_address_does_not_connect() {
    let inside = internal(Ipv4Addr::LOCALHOST, true);
    let location = format!("https://localhost:{}/v2/app/manifests/v1", inside.port());
    let registry = Server::https(LOCAL_3, move |_| redirect(location.clone()));
    let err = lookup_error(
        settings(&[], &["127.0.0.1/32", "::1"]),
        &format!("{}/app:v1", registry.host),
    )
    .await;
    assert!(matches!(err, LookupError::Unreachable { .. }), "{err:?}");
    assert_no_secret(&err);
    assert!(inside.seen().is_empty(), "connected: {:?}", inside.seen());
    assert_eq!(registry.seen().len(), 1);
}

#[tokio::test]
async fn an_image_host_that_is_denied_is_never_contacted() {
    let target = internal(Ipv4Addr::LOCALHOST, false);
    let deny = ["127.0.0.1/32", "::1/128"];
    // As an address: refused before any connection, saying why.
    let err = lookup_error(
        settings(&[&target.host], &deny),
        &format!("{}/app:v1", target.host),
    )
    .await;
    assert!(matches!(err, LookupError::NotAllowed { .. }), "{err:?}");
    assert!(err.to_string().contains("registry_denylist"), "{err}");
    // As a name that resolves to it: refused when it is resolved.
    let by_name = format!("localhost:{}", target.port());
    let err = lookup_error(settings(&[&by_name], &deny), &format!("{by_name}/app:v1")).await;
    assert!(matches!(err, LookupError::Unreachable { .. }), "{err:?}");
    assert_no_secret(&err);
    assert!(target.seen().is_empty(), "contacted: {:?}", target.seen());
}

#[tokio::test]
async fn a_denied_mirror_is_skipped_for_the_origin() {
    let origin = registry::plain();
    let mirror = internal(LOCAL_2, false);
    let mut settings = settings(&[&origin.host, &mirror.host], &["127.0.0.2/32"]);
    settings
        .mirrors
        .insert(origin.host.clone(), mirror.host.clone());
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();
    let found = resolver
        .resolve(&format!("{}/fixtures/arm64-oci:v1", origin.host))
        .await
        .unwrap();
    assert_eq!(found.served_by, origin.host);
    assert!(mirror.seen().is_empty(), "asked: {:?}", mirror.seen());
}

/// A registry whose every request is refused with a Bearer challenge naming `realm`.
fn challenging(realm: String) -> Server {
    Server::https(Ipv4Addr::LOCALHOST, move |_| {
        let mut response = answer(
            401,
            "application/json",
            r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#,
        );
        response.headers_mut().insert(
            "www-authenticate",
            format!(r#"Bearer realm="{realm}",service="hostile""#)
                .parse()
                .unwrap(),
        );
        response
    })
}

fn token_service(ip: Ipv4Addr, tls: bool) -> Server {
    let token = |_: &Request<hyper::body::Incoming>| {
        answer(
            200,
            "application/json",
            r#"{"token":"t0k3n","expires_in":300}"#,
        )
    };
    if tls {
        Server::https(ip, token)
    } else {
        Server::http(ip, token)
    }
}

#[tokio::test]
async fn a_realm_on_a_denied_host_is_not_asked() {
    let tokens = token_service(LOCAL_2, true);
    let registry = challenging(format!("https://{}/token", tokens.host));
    let err = lookup_error(
        settings(&[], &["127.0.0.2"]),
        &format!("{}/app:v1", registry.host),
    )
    .await;
    assert!(matches!(err, LookupError::NotAllowed { .. }), "{err:?}");
    assert!(err.to_string().contains("token service"), "{err}");
    assert!(tokens.seen().is_empty(), "asked: {:?}", tokens.seen());
}

#[tokio::test]
async fn a_plain_http_realm_is_not_asked_even_without_credentials() {
    let tokens = token_service(Ipv4Addr::LOCALHOST, false);
    let registry = challenging(format!("http://{}/token", tokens.host));
    let err = lookup_error(settings(&[], &[]), &format!("{}/app:v1", registry.host)).await;
    assert!(matches!(err, LookupError::NotAllowed { .. }), "{err:?}");
    assert!(
        err.to_string().contains("plain-http token service"),
        "{err}"
    );
    assert!(tokens.seen().is_empty(), "asked: {:?}", tokens.seen());
}

#[tokio::test]
async fn a_realm_error_body_is_not_reflected() {
    let realm = internal(LOCAL_2, true);
    let registry = challenging(format!("https://{}/token", realm.host));
    let err = lookup_error(settings(&[], &[]), &format!("{}/app:v1", registry.host)).await;
    assert!(
        matches!(err, LookupError::Registry { status: 500, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("token service"), "{err}");
    assert_no_secret(&err);
    assert_eq!(realm.seen().len(), 1);
}

#[tokio::test]
async fn registry_error_bodies_give_only_a_status_and_the_spec_codes() {
    let long_text = format!("{SECRET} {}", "lorem ipsum ".repeat(500));
    let envelope =
        json!({"errors": [{"code": "MANIFEST_INVALID", "message": SECRET, "detail": SECRET}]});
    let cases: Vec<(u16, &str, String, &str)> = vec![
        (
            400,
            "application/json",
            envelope.to_string(),
            "HTTP 400: MANIFEST_INVALID",
        ),
        (
            502,
            "text/html",
            format!("<html><pre>{long_text}</pre></html>"),
            "HTTP 502: Bad Gateway",
        ),
        (
            500,
            "application/json",
            json!({"errors": [{"code": SECRET}]}).to_string(),
            "HTTP 500: Internal Server Error",
        ),
        (404, "text/plain", long_text.clone(), "not found"),
    ];
    for (status, content_type, body, want) in cases {
        let (content_type, body) = (content_type.to_owned(), body.clone());
        let registry = Server::https(Ipv4Addr::LOCALHOST, move |_| {
            answer(status, &content_type, body.clone())
        });
        let err = lookup_error(settings(&[], &[]), &format!("{}/app:v1", registry.host)).await;
        assert!(err.to_string().contains(want), "{status}: {err}");
        assert_no_secret(&err);
        assert!(err.to_string().len() < 200, "{status}: {err}");
    }
}

/// Refused, open but not TLS, a certificate from an unknown CA: a Pod author cannot tell them
/// apart from the answer (the operator's debug log can).
#[tokio::test]
async fn connection_failures_read_the_same() {
    let closed = common::fake::closed_port();
    let not_tls = Server::http(Ipv4Addr::LOCALHOST, |_| answer(200, "text/plain", "hello"));
    let stranger = certs::TestCa::new().leaf(&["127.0.0.1"]);
    let bad_certificate = Server::start(Ipv4Addr::LOCALHOST, Some(acceptor(&stranger)), |_| {
        answer(200, "text/plain", "hello")
    });
    let mut reasons = Vec::new();
    for host in [&closed, &not_tls.host, &bad_certificate.host] {
        let err = lookup_error(settings(&[], &[]), &format!("{host}/app:v1")).await;
        assert!(matches!(err, LookupError::Unreachable { .. }), "{err:?}");
        reasons.push(err.reason().replace(host.as_str(), "HOST"));
    }
    assert!(
        reasons.iter().all(|r| *r == reasons[0]),
        "the reasons differ: {reasons:?}"
    );
    let lower = reasons[0].to_lowercase();
    for word in ["refused", "certificate", "tls", "handshake", "timed out"] {
        assert!(!lower.contains(word), "{reasons:?}");
    }
}

/// Blob redirects to another host (a CDN) are followed over https, and the registry's
/// credentials stay behind.
#[tokio::test]
async fn blob_redirects_to_another_host_are_followed_without_credentials() {
    let cdn = Server::https(LOCAL_3, |req| {
        if req.uri().path().ends_with("/config") {
            answer(200, "application/octet-stream", CONFIG)
        } else {
            answer(404, "text/plain", "")
        }
    });
    let cdn_host = cdn.host.clone();
    let manifest = manifest();
    let expected = format!(
        "Basic {}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "user:pass")
    );
    let registry = Server::https(Ipv4Addr::LOCALHOST, move |req| {
        let authorized = req
            .headers()
            .get("authorization")
            .is_some_and(|v| v.to_str().unwrap_or("") == expected);
        if !authorized {
            let mut response = answer(401, "application/json", "{}");
            response.headers_mut().insert(
                "www-authenticate",
                r#"Basic realm="hostile""#.parse().unwrap(),
            );
            return response;
        }
        if req.uri().path().contains("/blobs/") {
            redirect(format!("https://{cdn_host}/storage/config"))
        } else {
            answer(200, OCI_MANIFEST, manifest.clone())
        }
    });
    let mut store = CredentialStore::default();
    store.add(&registry.host, Credential::new("user", "pass", "test"));
    let resolver = Resolver::new(settings(&[], &[]), store).unwrap();
    let found = resolver
        .resolve(&format!("{}/app:v1", registry.host))
        .await
        .unwrap();
    assert_eq!(found.fact.platforms[0].to_string(), "linux/arm64");
    let at_cdn = cdn.seen();
    assert_eq!(at_cdn.len(), 1, "{at_cdn:?}");
    assert_eq!(at_cdn[0].path, "/storage/config");
    assert_eq!(at_cdn[0].authorization, None, "credentials followed");
}

#[tokio::test]
async fn insecure_registries_ignore_case() {
    let registry = registry::plain();
    let port = registry.host.rsplit_once(':').unwrap().1;
    let resolver = Resolver::new(
        settings(&[&format!("LocalHost:{port}")], &[]),
        CredentialStore::default(),
    )
    .unwrap();
    let found = resolver
        .resolve(&format!("localhost:{port}/fixtures/arm64-oci:v1"))
        .await
        .unwrap();
    assert_eq!(found.fact.platforms[0].to_string(), "linux/arm64");
}

/// End to end: the admission warning about an image whose registry redirects to an internal
/// http service says why, and carries nothing the service answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_warnings_carry_no_remote_body() {
    let imds = internal(Ipv4Addr::LOCALHOST, false);
    let to_imds = format!("http://{}/latest/meta-data/", imds.host);
    let redirecting = Server::https(Ipv4Addr::LOCALHOST, move |_| redirect(to_imds.clone()));
    let failing = Server::https(Ipv4Addr::LOCALHOST, |_| {
        answer(
            503,
            "application/json",
            json!({"errors": [{"code": "UNAVAILABLE", "message": SECRET}]}).to_string(),
        )
    });
    let server = TestServer::start(webhook::policy(), settings(&[&imds.host], &[])).await;
    let mut request = recorded("pod-create-simple.v1.json", "unused");
    let images = [
        format!("{}/app:v1", redirecting.host),
        format!("{}/app:v1", failing.host),
    ];
    request["request"]["object"]["spec"]["containers"][0]["image"] = json!(images[0]);
    let mut second = request["request"]["object"]["spec"]["containers"][0].clone();
    second["name"] = json!("second");
    second["image"] = json!(images[1]);
    request["request"]["object"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(second);
    let response: Value = webhook::client()
        .post(server.url("/mutate?timeout=10s"))
        .header("content-type", "application/json")
        .body(request.to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let warnings = response["response"]["warnings"].to_string();
    assert!(!warnings.contains(SECRET), "{warnings}");
    assert!(
        warnings.contains(&images[0]) && warnings.contains("plain http"),
        "{warnings}"
    );
    assert!(
        warnings.contains(&images[1]) && warnings.contains("HTTP 503: UNAVAILABLE"),
        "{warnings}"
    );
    assert!(imds.seen().is_empty(), "followed: {:?}", imds.seen());
}

/// Allowing an internal registry by address can be limited to its port: the real registry on
/// 127.0.0.1 is reached on the port the entry names, an internal service on another port of the
/// same address is never contacted. A deny entry with a port refuses that port only.
#[tokio::test]
async fn an_address_with_a_port_allows_or_denies_that_port_only() {
    let origin = registry::plain();
    let origin_port = origin.host.rsplit_once(':').unwrap().1.to_owned();
    let target = internal(Ipv4Addr::LOCALHOST, false);
    let mut allowed = settings(&[&origin.host, &target.host], &[]);
    allowed.transport.access = AccessRules::new(
        &[format!("127.0.0.1:{origin_port}")],
        &LINK_LOCAL.map(String::from),
    )
    .unwrap();
    let resolver = Resolver::new(allowed.clone(), CredentialStore::default()).unwrap();
    let found = resolver
        .resolve(&format!("{}/fixtures/arm64-oci:v1", origin.host))
        .await
        .unwrap();
    assert_eq!(found.fact.platforms.len(), 1);
    let err = lookup_error(allowed, &format!("{}/app:v1", target.host)).await;
    assert!(matches!(err, LookupError::NotAllowed { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not in registry_allowlist"),
        "{err}"
    );
    assert!(target.seen().is_empty(), "contacted: {:?}", target.seen());

    let denied = settings(
        &[&origin.host, &target.host],
        &[&format!("127.0.0.1:{}", target.port())],
    );
    let err = lookup_error(denied.clone(), &format!("{}/app:v1", target.host)).await;
    assert!(err.to_string().contains("registry_denylist"), "{err}");
    assert!(target.seen().is_empty(), "contacted: {:?}", target.seen());
    let resolver = Resolver::new(denied, CredentialStore::default()).unwrap();
    let found = resolver
        .resolve(&format!("{}/fixtures/arm64-oci:v1", origin.host))
        .await;
    assert!(found.is_ok(), "{found:?}");
}
