//! Registry faults, end to end through the webhook: a real registry behind a fault-injecting
//! proxy (slow, hung, 500, 429 with Retry-After, malformed and oversized manifests), a real
//! registry killed and restarted, a token service that is down. Every admission must be
//! answered inside its deadline, by the configured failure policy, with a warning; a tag seen
//! before is answered from its last known result while its registry is down; a registry that
//! keeps failing is left alone for a while (circuit breaker).

use crate::common;

use std::time::Duration;

use common::fault_proxy::{Fault, FaultProxy};
use common::registry::{self, Mode, Registry};
use common::webhook::{self, recorded, warnings, TestServer};
use serde_json::{json, Value};
use tolerable::mutate::OnLookupFailure;
use tolerable::registry::{CredentialStore, LookupError, Resolver, ResolverSettings};

/// The API server's deadline for these admissions (`?timeout=`): the deployed `timeoutSeconds`
/// (kustomize/base). Lookups get `lookup_timeout` (1 s, below), far inside it, so asserting the
/// answer before it keeps a margin that does not depend on the machine's speed (at 2 s it was
/// 1 s).
const DEADLINE: Duration = Duration::from_secs(10);

fn settings(insecure: &[&str]) -> ResolverSettings {
    let mut settings = common::settings();
    settings
        .transport
        .insecure_registries
        .extend(insecure.iter().map(|h| (*h).to_owned()));
    settings.lookup_timeout = Duration::from_secs(1);
    // Longer than the lookup budget, so a hung registry always meets the budget first.
    settings.transport.read_timeout = Duration::from_secs(5);
    settings.cache.failure_ttl = Duration::from_millis(100);
    settings
}

/// The recorded Pod CREATE, its one container's image replaced.
fn admission_for(image: &str) -> Value {
    let mut request = recorded("pod-create-simple.v1.json", "unused");
    request["request"]["object"]["spec"]["containers"][0]["image"] = json!(image);
    request
}

/// Posts `request` with the API server's timeout; the response and how long it took.
async fn admit(server: &TestServer, request: &Value) -> (Value, Duration) {
    webhook::admit(server, request, DEADLINE).await
}

/// Allowed, inside the deadline, no patch, and a warning naming the image and `why`.
fn assert_allowed_unchanged(response: &Value, elapsed: Duration, image: &str, why: &str) {
    assert!(elapsed < DEADLINE, "answered after {elapsed:?}: {response}");
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    let warnings = warnings(response);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(image) && w.contains(why)),
        "expected a warning naming {image} and {why:?}: {warnings:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_registry_fault_is_answered_in_time_by_the_failure_policy() {
    let upstream = registry::plain();
    let cases = [
        (
            Fault::Slow(Duration::from_secs(5)),
            "did not finish within 1s",
        ),
        (Fault::Hang, "did not finish within 1s"),
        (Fault::Status(500), "HTTP 500"),
        (Fault::Status(503), "HTTP 503"),
        (
            Fault::RateLimited {
                retry_after_secs: 30,
            },
            "rate limited (Retry-After: 30s)",
        ),
        (Fault::MalformedManifest, "EOF while parsing"),
        (Fault::OversizedManifest(6 << 20), "larger than 4 MiB"),
    ];
    for (fault, why) in cases {
        let proxy = FaultProxy::start(&upstream.host);
        let server = TestServer::start(webhook::policy(), settings(&[&proxy.host])).await;
        let image = format!("{}/fixtures/arm64-oci:v1", proxy.host);
        // Healthy first: the proxy is transparent.
        let (healthy, _) = admit(&server, &admission_for(&image)).await;
        assert!(healthy.get("patch").is_some(), "{fault:?}: {healthy}");

        proxy.set(fault.clone());
        let never_seen = format!("{}/fixtures/multiarch-oci:v1", proxy.host);
        let (response, elapsed) = admit(&server, &admission_for(&never_seen)).await;
        assert_allowed_unchanged(&response, elapsed, &never_seen, why);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_denies_inside_the_deadline() {
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.set(Fault::Hang);
    let mut policy = webhook::policy();
    policy.on_lookup_failure = OnLookupFailure::Deny;
    let server = TestServer::start(policy, settings(&[&proxy.host])).await;
    let image = format!("{}/fixtures/arm64-oci:v1", proxy.host);
    let (response, elapsed) = admit(&server, &admission_for(&image)).await;
    assert!(elapsed < DEADLINE, "answered after {elapsed:?}");
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(&image) && message.contains("did not finish within 1s"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_service_down_is_answered_in_time_with_a_warning() {
    let closed = common::fake::closed_port();
    let registry = Registry::start_with_realm(Mode::Token, Some(format!("http://{closed}/token")));
    let server = TestServer::start(webhook::policy(), settings(&[&closed])).await;
    let image = format!("{}/fixtures/arm64-oci:v1", registry.host);
    let (response, elapsed) = admit(&server, &admission_for(&image)).await;
    assert_allowed_unchanged(&response, elapsed, &image, "token service");
}

/// The registry process is killed mid-run: a tag seen before keeps its answer (marked stale),
/// a new one is allowed unchanged, the breaker stops asking, and after the restart everything
/// is fresh again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_killed_and_restarted_stale_if_error_and_circuit_breaker() {
    let registry = Registry::start_restartable();
    let mut settings = settings(&[&registry.host]);
    settings.cache.tag_ttl = Duration::from_millis(300);
    settings.breaker.failures = 2;
    settings.breaker.cooldown = Duration::from_secs(1);
    let server = TestServer::start(webhook::policy(), settings).await;
    let seen = format!("{}/fixtures/arm64-oci:v1", registry.host);
    let (fresh, _) = admit(&server, &admission_for(&seen)).await;
    let fresh_patch = fresh["patch"].clone();
    assert!(fresh_patch.is_string(), "{fresh}");
    assert!(warnings(&fresh).is_empty(), "{fresh}");

    registry.stop();
    tokio::time::sleep(Duration::from_millis(400)).await; // the tag's answer is no longer fresh

    // Seen before: the same patch as before, and a warning saying why and how old it is.
    let (stale, elapsed) = admit(&server, &admission_for(&seen)).await;
    assert!(elapsed < DEADLINE);
    assert_eq!(stale["allowed"], true);
    assert_eq!(stale["patch"], fresh_patch, "{stale}");
    let stale_warnings = warnings(&stale);
    assert!(
        stale_warnings.iter().any(|w| w.contains(&seen)
            && w.contains("registry unavailable")
            && w.contains("used the platforms it reported")),
        "{stale_warnings:?}"
    );
    // Asked again at once, it is served from the cache, still stale, still saying so, and
    // counted as a stale answer each time.
    let (again, _) = admit(&server, &admission_for(&seen)).await;
    assert_eq!(again["patch"], fresh_patch, "{again}");
    assert_eq!(warnings(&again), stale_warnings);
    let metrics = webhook::metrics_text(&server).await;
    assert!(
        metrics.contains("tolerable_cache_lookups_total{result=\"stale\"} 2\n"),
        "{metrics}"
    );

    unseen_images_open_the_circuit(&server, &registry.host).await;

    registry.restart();
    tokio::time::sleep(Duration::from_millis(1100)).await; // the cooldown passes
    let (recovered, _) = admit(&server, &admission_for(&seen)).await;
    assert_eq!(recovered["patch"], fresh_patch);
    assert!(warnings(&recovered).is_empty(), "{recovered}");
}

/// Images never seen while the registry is down: nothing to fall back on; a couple of failures
/// open the circuit, after which the registry is not asked at all.
async fn unseen_images_open_the_circuit(server: &TestServer, registry_host: &str) {
    let mut warned_open = false;
    for tag in 0..4 {
        let image = format!("{}/fixtures/multiarch-oci:t{tag}", registry_host);
        let (response, elapsed) = admit(server, &admission_for(&image)).await;
        assert!(elapsed < DEADLINE);
        assert_eq!(response["allowed"], true);
        assert!(response.get("patch").is_none(), "{response}");
        warned_open |= warnings(&response)
            .iter()
            .any(|w| w.contains("not asking registry"));
    }
    assert!(warned_open, "the circuit never opened");
    let metrics = webhook::metrics_text(server).await;
    // The series exist from the start (at 0): the counts must have moved.
    let count = |series: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series}:\n{metrics}"))
            .parse()
            .unwrap()
    };
    assert!(
        count(&format!(
            "tolerable_registry_circuit_opened_total{{registry=\"{}\"}}",
            registry_host
        )) >= 1,
        "{metrics}"
    );
    assert!(
        count("tolerable_cache_lookups_total{result=\"stale\"}") >= 1,
        "{metrics}"
    );
}

/// A registry answering 500 is asked `failures` times, then left alone for the cooldown, then
/// asked again.
#[tokio::test]
async fn circuit_breaker_stops_hammering_a_failing_registry() {
    let proxy = FaultProxy::start(&registry::plain().host);
    let mut settings = settings(&[&proxy.host]);
    settings.breaker.failures = 3;
    settings.breaker.cooldown = Duration::from_millis(800);
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();
    proxy.set(Fault::Status(500));
    let image = |tag: usize| format!("{}/fixtures/multiarch-oci:{tag}", proxy.host);
    for tag in 0..20 {
        let err = resolver.resolve(&image(tag)).await.unwrap_err();
        if tag < 3 {
            assert!(
                matches!(err, LookupError::Registry { status: 500, .. }),
                "{err}"
            );
        } else {
            assert!(matches!(err, LookupError::CircuitOpen { .. }), "{err}");
            assert!(
                err.to_string().contains("HTTP 500"),
                "names the cause: {err}"
            );
        }
    }
    assert_eq!(proxy.requests(), 3, "asked only until the circuit opened");

    // After the cooldown it is tried again; one more failure re-opens it at once.
    tokio::time::sleep(Duration::from_millis(900)).await;
    resolver.resolve(&image(100)).await.unwrap_err();
    assert_eq!(proxy.requests(), 4);
    let err = resolver.resolve(&image(101)).await.unwrap_err();
    assert!(matches!(err, LookupError::CircuitOpen { .. }), "{err}");
    assert_eq!(proxy.requests(), 4);

    // Half-open: of many lookups at once after the cooldown, one goes out as the probe.
    proxy.set(Fault::Hang);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let images: Vec<String> = (200..210).map(image).collect();
    let results = futures_util::future::join_all(images.iter().map(|i| resolver.resolve(i))).await;
    assert!(results.iter().all(Result::is_err));
    let fast = results
        .iter()
        .filter(|r| matches!(r, Err(LookupError::CircuitOpen { .. })))
        .count();
    assert_eq!(fast, 9, "{results:?}");
    assert_eq!(proxy.requests(), 5, "only the probe went out");

    // Recovered: the next try closes it.
    proxy.set(Fault::None);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let found = resolver
        .resolve(&format!("{}/fixtures/multiarch-oci:v1", proxy.host))
        .await;
    assert!(found.is_ok(), "{found:?}");
    resolver.resolve(&image(102)).await.unwrap_err(); // not found: an answer, not an outage
    let found = resolver
        .resolve(&format!("{}/fixtures/arm64-oci:v1", proxy.host))
        .await;
    assert!(found.is_ok(), "{found:?}");
}

/// Docker Hub's rate-limit headers become gauges per registry, and the requests are counted by
/// method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_headers_are_read_into_gauges() {
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.add_header("ratelimit-limit", "100;w=21600");
    proxy.add_header("ratelimit-remaining", "42;w=21600");
    let server = TestServer::start(webhook::policy(), settings(&[&proxy.host])).await;
    let image = format!("{}/fixtures/arm64-oci:v1", proxy.host);
    let (response, _) = admit(&server, &admission_for(&image)).await;
    assert!(response.get("patch").is_some(), "{response}");
    let metrics = webhook::metrics_text(&server).await;
    let host = &proxy.host;
    for needle in [
        format!("tolerable_registry_rate_limit{{registry=\"{host}\"}} 100\n"),
        format!("tolerable_registry_rate_limit_remaining{{registry=\"{host}\"}} 42\n"),
        // The manifest and its config blob: two GETs, nothing else.
        format!(
            "tolerable_registry_requests_total{{registry=\"{host}\",method=\"GET\",status=\"200\"}} 2\n"
        ),
    ] {
        assert!(metrics.contains(&needle), "{needle} missing:\n{metrics}");
    }
}

/// 429 with `Retry-After`: not asked again before the registry said so, even below the
/// failure threshold.
#[tokio::test]
async fn retry_after_is_honoured() {
    let proxy = FaultProxy::start(&registry::plain().host);
    let resolver = Resolver::new(settings(&[&proxy.host]), CredentialStore::default()).unwrap();
    proxy.set(Fault::RateLimited {
        retry_after_secs: 1,
    });
    let image = |tag: &str| format!("{}/fixtures/multiarch-oci:{tag}", proxy.host);
    let err = resolver.resolve(&image("a")).await.unwrap_err();
    assert!(err.to_string().contains("429"), "{err}");
    assert_eq!(proxy.requests(), 1);
    let err = resolver.resolve(&image("b")).await.unwrap_err();
    assert!(matches!(err, LookupError::CircuitOpen { .. }), "{err}");
    assert_eq!(proxy.requests(), 1, "asked again before Retry-After");
    proxy.set(Fault::None);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    resolver.resolve(&image("v1")).await.unwrap();
    assert_eq!(proxy.requests(), 2);
}

/// A webhook whose API server times out sooner than `lookup_timeout`: lookups of a hung
/// registry end inside the admission's own budget, so they still count towards its breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hangs_count_for_the_breaker_even_when_the_api_server_timeout_is_shorter() {
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.set(Fault::Hang);
    let mut settings = settings(&[&proxy.host]);
    settings.lookup_timeout = Duration::from_secs(20);
    settings.transport.read_timeout = Duration::from_secs(20);
    settings.breaker.failures = 2;
    let server = TestServer::start(webhook::policy(), settings).await;
    // Still shorter than `lookup_timeout`, and long enough that the margin the code keeps for
    // the answer (a fifth: 2 s) does not depend on the machine's speed (at 2 s it was 0.4 s).
    let api_server_timeout = Duration::from_secs(10);
    let mut last = Vec::new();
    for tag in 0..3 {
        let image = format!("{}/fixtures/multiarch-oci:h{tag}", proxy.host);
        let (response, elapsed) =
            webhook::admit(&server, &admission_for(&image), api_server_timeout).await;
        assert!(
            elapsed < api_server_timeout,
            "answered after {elapsed:?}, past the API server's {api_server_timeout:?}"
        );
        assert_eq!(response["allowed"], true);
        last = warnings(&response);
    }
    assert!(
        last.iter().any(|w| w.contains("not asking registry")),
        "the breaker never opened: {last:?}"
    );
    assert_eq!(proxy.requests(), 2, "the third lookup did not go out");
}
