//! Hostile Pods and registries, the lookup side: a Pod naming thousands of images, a flood of
//! lookups against one registry, an index that fans out or invents platforms. Every admission is
//! answered inside its deadline with bounded registry work, and one tenant's flood does not
//! switch lookups off for the others. All on loopback: a real registry, the fault proxy in front
//! of it, and a small hostile registry written here.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::fault_proxy::{Fault, FaultProxy};
use common::registry;
use common::webhook::{self, recorded, warnings, TestServer};
use http_body_util::Full;
use serde_json::{json, Value};
use tolerable::mutate::OnLookupFailure;
use tolerable::registry::{CredentialStore, LookupError, Resolver};

const DEADLINE_SECS: u64 = 3;

async fn admit(server: &TestServer, request: &Value) -> (Value, Duration) {
    webhook::admit(server, request, Duration::from_secs(DEADLINE_SECS)).await
}

/// The test settings, with `host` (a plain-http test registry) listed as insecure.
fn settings_for(host: &str) -> tolerable::registry::ResolverSettings {
    let mut settings = common::settings();
    settings.transport.insecure_registries.push(host.to_owned());
    settings
}

fn pod_with_images(images: &[String]) -> Value {
    let mut request = recorded("pod-create-simple.v1.json", "unused");
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect();
    request["request"]["object"]["spec"]["containers"] = json!(containers);
    request
}

/// 50,000 containers naming 50,000 distinct images: nothing is looked up (far above any real
/// Pod), the Pod is answered at once, unchanged, with one warning — or denied under
/// `on_lookup_failure = "deny"`. De-duplication is linear, so /healthz never waits on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_naming_fifty_thousand_images_is_answered_without_lookups() {
    let proxy = FaultProxy::start(&registry::plain().host);
    let settings = settings_for(&proxy.host);
    let server = TestServer::start(webhook::policy(), settings.clone()).await;
    // Short names, so 50,000 fit the API server's 3 MiB request limit.
    let images: Vec<String> = (0..50_000).map(|i| format!("127.0.0.1:1/a{i}")).collect();
    let request = pod_with_images(&images);
    assert!(request.to_string().len() < 3 << 20, "fits the body limit");
    let (response, elapsed) = admit(&server, &request).await;
    eprintln!("50,000-image Pod answered in {elapsed:?}");
    assert!(elapsed < Duration::from_secs(DEADLINE_SECS), "{elapsed:?}");
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());
    let warnings = warnings(&response);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("more than max_containers_per_pod (1000)"));
    assert_eq!(proxy.requests(), 0, "nothing was looked up");

    // 500 containers, 200 distinct images: under the container cap, over the image cap.
    let images: Vec<String> = (0..500)
        .map(|i| format!("{}/fixtures/app{}:v1", proxy.host, i % 200))
        .collect();
    let mut deny = webhook::policy();
    deny.on_lookup_failure = OnLookupFailure::Deny;
    let strict = TestServer::start(deny, settings).await;
    let (response, _) = admit(&strict, &pod_with_images(&images)).await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("names 200 distinct images, more than max_images_per_pod (100)"),
        "{message}"
    );
    assert_eq!(proxy.requests(), 0);
}

/// A flood of lookups against one slow registry: tolerable keeps at most 16 lookups in flight
/// to it, those that never got a turn fail as "too many lookups in flight" within the deadline,
/// and the breaker does not open for what tolerable itself cut short: the next tenant's lookup
/// to the same registry still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_flood_is_bounded_and_does_not_open_the_breaker_for_others() {
    let proxy = FaultProxy::start(&registry::plain().host);
    let mut settings = settings_for(&proxy.host);
    settings.lookup_timeout = Duration::from_secs(1);
    settings.breaker.failures = 3;
    proxy.set(Fault::Slow(Duration::from_millis(100)));
    let flood = |resolver: Arc<Resolver>, tag: &'static str| {
        let host = proxy.host.clone();
        futures_util::future::join_all((0..200).map(move |i| {
            let resolver = resolver.clone();
            let image = format!("{host}/fixtures/{tag}{i}:v1");
            async move { resolver.resolve(&image).await }
        }))
    };
    // Time enough for all: 200 lookups of distinct tags at once (what a few 100-image Pods
    // would ask) reach the registry at most 16 at a time.
    let mut patient = settings.clone();
    patient.lookup_timeout = Duration::from_secs(10);
    let resolver = Arc::new(Resolver::new(patient, CredentialStore::default()).unwrap());
    let results = flood(resolver, "patient").await;
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(LookupError::NotFound { .. }))));
    eprintln!(
        "200 lookups at once: at most {} registry requests in flight",
        proxy.max_in_flight()
    );
    assert!(
        proxy.max_in_flight() <= 16,
        "{} requests in flight at once",
        proxy.max_in_flight()
    );

    // A 1s budget: most never get their turn, and say so, inside the budget.
    proxy.set(Fault::Slow(Duration::from_millis(400)));
    let resolver = Arc::new(Resolver::new(settings, CredentialStore::default()).unwrap());
    let started = Instant::now();
    let results = flood(resolver.clone(), "flood").await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    eprintln!("flood with a 1s budget answered in {:?}", started.elapsed());
    let throttled = results
        .iter()
        .filter(|r| matches!(r, Err(LookupError::Throttled { .. })))
        .count();
    let kinds: std::collections::BTreeMap<&str, usize> =
        results.iter().fold(Default::default(), |mut m, r| {
            *m.entry(r.as_ref().err().map_or("ok", LookupError::metric_label))
                .or_default() += 1;
            m
        });
    assert!(throttled > 100, "{throttled} throttled: {kinds:?}");
    assert!(results.iter().all(|r| r.is_err()), "no such tags");

    // The registry answered everything it was asked (404s, slowly): its breaker stays closed.
    proxy.set(Fault::None);
    let good = format!("{}/fixtures/arm64-oci:v1", proxy.host);
    let found = resolver.resolve(&good).await.unwrap();
    assert_eq!(found.fact.platforms.len(), 1);
    // A lookup that never got its turn was not cached: asked again, the registry is asked.
    let never_asked = results
        .iter()
        .position(|r| matches!(r, Err(LookupError::Throttled { .. })))
        .unwrap();
    let before = proxy.requests();
    let again = resolver
        .resolve(&format!("{}/fixtures/flood{never_asked}:v1", proxy.host))
        .await;
    assert!(
        matches!(again, Err(LookupError::NotFound { .. })),
        "{again:?}"
    );
    assert_eq!(proxy.requests(), before + 1);
}

/// A registry the attacker controls: indexes listing 500 and 5,000 platform-less entries that
/// all point to one child, one of 500 invented platforms, and one of 600 entries. Each costs at
/// most a couple of requests, ends inside its deadline, and never becomes a huge answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_indexes_cost_bounded_work() {
    let hostile = HostileRegistry::start();
    let settings = settings_for(&hostile.host);
    let resolver = Resolver::new(settings.clone(), CredentialStore::default()).unwrap();

    let started = Instant::now();
    let fan_out = resolver
        .resolve(&format!("{}/evil/fanout:v1", hostile.host))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        fan_out
            .fact
            .platforms
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["linux/arm64"]
    );
    // The index, the one child it names 500 times, and that child's config.
    assert_eq!(hostile.requests(), 3, "each child is read once");

    // 5,000 entries: refused as it is, without reading a child.
    let err = resolver
        .resolve(&format!("{}/evil/huge:v1", hostile.host))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("more than 512 manifests"), "{err}");
    assert_eq!(hostile.requests(), 4);

    let err = resolver
        .resolve(&format!("{}/evil/platforms:v1", hostile.host))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("more than 64 platforms"), "{err}");

    let err = resolver
        .resolve(&format!("{}/evil/long:v1", hostile.host))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("more than 512 manifests"), "{err}");

    // Through the webhook: the invented platforms never reach the answer.
    let server = TestServer::start(webhook::policy(), settings).await;
    let image = format!("{}/evil/platforms:v1", hostile.host);
    let (response, elapsed) = admit(&server, &pod_with_images(&[image])).await;
    assert!(elapsed < Duration::from_secs(DEADLINE_SECS));
    assert!(
        response.to_string().len() < 4096,
        "{}",
        response.to_string().len()
    );
}

/// A plain-http registry serving indexes built to cost work.
struct HostileRegistry {
    host: String,
    requests: Arc<AtomicUsize>,
}

impl HostileRegistry {
    fn start() -> Self {
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let documents = HostileDocuments::new();
        let port = common::serve_http(move |req| {
            counter.fetch_add(1, Ordering::SeqCst);
            documents.answer(req.uri().path())
        });
        Self {
            host: format!("127.0.0.1:{port}"),
            requests,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// What the hostile registry serves: one ordinary arm64 image (a child manifest and its
/// config) and the indexes built on it.
struct HostileDocuments {
    config: String,
    child: String,
    child_digest: String,
    /// `evil/fanout:v1`: 500 platform-less entries, all the one child.
    fanout: String,
    /// `evil/huge:v1`: 5,000 platform-less entries.
    huge: String,
    /// `evil/platforms:v1`: 500 entries, each an invented architecture.
    platforms: String,
    /// `evil/long:v1`: 600 entries, all linux/amd64.
    long: String,
}

impl HostileDocuments {
    fn new() -> Self {
        let config = json!({"os": "linux", "architecture": "arm64", "rootfs": {"type": "layers", "diff_ids": []}})
            .to_string();
        let config_digest = common::fixtures::sha256(config.as_bytes());
        let child = json!({
            "schemaVersion": 2,
            "mediaType": common::fixtures::OCI_MANIFEST,
            "config": {"mediaType": common::fixtures::OCI_CONFIG, "digest": config_digest, "size": config.len()},
            "layers": [],
        })
        .to_string();
        let child_digest = common::fixtures::sha256(child.as_bytes());
        let index = |entries: Vec<Value>| {
            json!({"schemaVersion": 2, "mediaType": common::fixtures::OCI_INDEX, "manifests": entries})
                .to_string()
        };
        let child_entry = json!({"mediaType": common::fixtures::OCI_MANIFEST, "digest": child_digest, "size": child.len()});
        let fanout = index(vec![child_entry.clone(); 500]);
        let huge = index(vec![child_entry.clone(); 5000]);
        let platforms = index(
            (0..500)
                .map(|i| {
                    let mut e = child_entry.clone();
                    e["platform"] = json!({"os": "linux", "architecture": format!("arch{i}")});
                    e
                })
                .collect(),
        );
        let long = index(
            (0..600)
                .map(|_| {
                    let mut e = child_entry.clone();
                    e["platform"] = json!({"os": "linux", "architecture": "amd64"});
                    e
                })
                .collect(),
        );
        Self {
            config,
            child,
            child_digest,
            fanout,
            huge,
            platforms,
            long,
        }
    }

    /// The registry's answer to a GET of `path`: a manifest or the config blob with its
    /// digest, or the registry's 404.
    fn answer(&self, path: &str) -> hyper::Response<Full<Bytes>> {
        let (media_type, body) = match path {
            "/v2/evil/fanout/manifests/v1" => (common::fixtures::OCI_INDEX, &self.fanout),
            "/v2/evil/huge/manifests/v1" => (common::fixtures::OCI_INDEX, &self.huge),
            "/v2/evil/platforms/manifests/v1" => (common::fixtures::OCI_INDEX, &self.platforms),
            "/v2/evil/long/manifests/v1" => (common::fixtures::OCI_INDEX, &self.long),
            p if p.ends_with(&format!("/manifests/{}", self.child_digest)) => {
                (common::fixtures::OCI_MANIFEST, &self.child)
            }
            p if p.contains("/blobs/") => ("application/octet-stream", &self.config),
            _ => {
                let mut response = hyper::Response::new(Full::new(Bytes::from_static(
                    br#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#,
                )));
                *response.status_mut() = hyper::StatusCode::NOT_FOUND;
                return response;
            }
        };
        let digest = common::fixtures::sha256(body.as_bytes());
        let mut response = hyper::Response::new(Full::new(Bytes::from(body.clone())));
        let headers = response.headers_mut();
        headers.insert("content-type", media_type.parse().unwrap());
        headers.insert("docker-content-digest", digest.parse().unwrap());
        response
    }
}
