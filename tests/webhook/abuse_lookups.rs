//! Hostile Pods and registries, the lookup side: a Pod naming thousands of images, a flood of
//! lookups against one registry, an index that fans out or invents platforms. Every admission is
//! answered inside its deadline with bounded registry work, and one tenant's flood does not
//! switch lookups off for the others. All on loopback: a real registry, the fault proxy in front
//! of it, and the hostile registry of `common::hostile` (nested indexes, stalled bodies,
//! invented platforms).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::fault_proxy::{Fault, FaultProxy};
use common::hostile::{self, HostileRegistry};
use common::registry;
use common::webhook::{self, recorded, warnings, TestServer};
use serde_json::{json, Value};
use tolerable::mutate::OnLookupFailure;
use tolerable::registry::{CredentialStore, LookupError, Resolver};

/// The API server's timeout for these admissions, sent with each (`?timeout=`): the webhook's
/// `timeoutSeconds` as deployed (kustomize/base). Each answer is checked against it (answered
/// before the API server gives up, the configured value) and against the event that would
/// show a deadline overrun inside the webhook: no lookup cut off by the admission's own
/// deadline (each ends by its own bound, `lookup_timeout`, or is never made). How fast is
/// BENCHMARKS.md's.
const DEADLINE_SECS: u64 = 10;

async fn admit(server: &TestServer, request: &Value) -> (Value, Duration) {
    let (response, elapsed) =
        webhook::admit(server, request, Duration::from_secs(DEADLINE_SECS)).await;
    let overrun = warnings(&response)
        .into_iter()
        .find(|w| w.contains("within the admission deadline"));
    assert!(overrun.is_none(), "{overrun:?}");
    (response, elapsed)
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

/// Admits a Pod naming `images` through the webhook: answered within the deadline, allowed
/// unchanged, and for each image a warning `names_why(image, warning)` accepts (the image named
/// with the bound or failure it met).
async fn allowed_unchanged_naming_each(
    server: &TestServer,
    images: &[String],
    names_why: impl Fn(&str, &str) -> bool,
) {
    let (response, elapsed) = admit(server, &pod_with_images(images)).await;
    assert!(elapsed < Duration::from_secs(DEADLINE_SECS), "{elapsed:?}");
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
    let warned = warnings(&response);
    for image in images {
        assert!(
            warned.iter().any(|w| names_why(image, w)),
            "{image}: {warned:?}"
        );
    }
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
    // Answered within the API server's own timeout, with the right outcome and no lookup; how
    // fast is a figure in BENCHMARKS.md (0.28 s), not a test's.
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

/// tolerable's per-registry cap (src/registry.rs, MAX_LOOKUPS_PER_HOST).
const MAX_LOOKUPS_PER_HOST: usize = 16;

/// 200 lookups at once of distinct tags (what a few 100-image Pods would ask) on `host`.
async fn flood(
    resolver: Arc<Resolver>,
    host: &str,
    tag: &str,
) -> Vec<Result<Arc<tolerable::registry::ImagePlatforms>, LookupError>> {
    futures_util::future::join_all((0..200).map(|i| {
        let resolver = resolver.clone();
        let image = format!("{host}/fixtures/{tag}{i}:v1");
        async move { resolver.resolve(&image).await }
    }))
    .await
}

/// The flood with `settings`' 1 s budget through a proxy answering in 400 ms: ended by the
/// lookups' deadlines. The resolver, for what follows, and the results.
async fn flood_with_a_short_budget(
    proxy: &FaultProxy,
    settings: tolerable::registry::ResolverSettings,
) -> (
    Arc<Resolver>,
    Vec<Result<Arc<tolerable::registry::ImagePlatforms>, LookupError>>,
) {
    // A 1s budget: most never get their turn, and say so, inside the budget. The bound the
    // code guarantees, whatever the machine's speed: each lookup ends by its own deadline (a
    // turn is waited for, and used, only until then) — not when the registry could have
    // answered them all through 16 turns, each request taking the proxy's 400 ms at least:
    // ⌈200 / 16⌉ × 400 ms = 5.2 s. A flood that waited for its turns could not end sooner,
    // however fast the machine; one that keeps its deadlines ends at 1 s plus the CPU time
    // of 200 lookups, the rest is margin.
    let delay = Duration::from_millis(400);
    proxy.set(Fault::Slow(delay));
    let resolver = Arc::new(Resolver::new(settings, CredentialStore::default()).unwrap());
    let started = Instant::now();
    let results = flood(resolver.clone(), &proxy.host, "flood").await;
    let elapsed = started.elapsed();
    let rounds = u32::try_from(200_usize.div_ceil(MAX_LOOKUPS_PER_HOST)).unwrap();
    let waiting_for_turns = delay * rounds;
    eprintln!("flood with a 1s budget answered in {elapsed:?}");
    assert!(
        elapsed < waiting_for_turns,
        "{elapsed:?}: as long as waiting for every turn ({waiting_for_turns:?})"
    );
    assert!(
        results.iter().all(|r| matches!(
            r,
            Err(LookupError::NotFound { .. }
                | LookupError::Throttled { .. }
                | LookupError::Timeout { .. })
        )),
        "a lookup ended otherwise than by an answer or its deadline: {results:?}"
    );
    (resolver, results)
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
    // Time enough for all: 200 lookups of distinct tags at once (what a few 100-image Pods
    // would ask) reach the registry at most 16 at a time.
    let mut patient = settings.clone();
    patient.lookup_timeout = Duration::from_secs(10);
    let resolver = Arc::new(Resolver::new(patient, CredentialStore::default()).unwrap());
    let results = flood(resolver, &proxy.host, "patient").await;
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(LookupError::NotFound { .. }))));
    eprintln!(
        "200 lookups at once: at most {} registry requests in flight",
        proxy.max_in_flight()
    );
    assert!(
        proxy.max_in_flight() <= MAX_LOOKUPS_PER_HOST,
        "{} requests in flight at once",
        proxy.max_in_flight()
    );

    let (resolver, results) = flood_with_a_short_budget(&proxy, settings).await;
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

    // Bounded by what it asks (the request count below), not by how fast this machine is: it
    // ends with the right answer, so inside the lookup's own budget (past it, the lookup ends
    // as LookupError::Timeout, which the unwrap refuses).
    let fan_out = resolver
        .resolve(&format!("{}/evil/fanout:v1", hostile.host))
        .await
        .unwrap();
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

/// The sum of every sample of `name` in a `/metrics` text (0 when it has none).
fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// Waits until the server's `tolerable_registry_bytes_in_flight` reads 0 (the lookups an
/// admission abandoned give their bytes back as they are dropped); the last reading otherwise.
async fn registry_bytes_drained(server: &TestServer) -> f64 {
    let mut held = f64::NAN;
    for _ in 0..100 {
        held = metric_sum(
            &webhook::metrics_text(server).await,
            "tolerable_registry_bytes_in_flight",
        );
        if held == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held
}

/// Nested indexes, each within every per-index limit but 64³ image reads when walked index by
/// index: one lookup makes at most 128 registry requests, asks for each document at most once,
/// and ends as the image's own failure, naming the bound. Five such images leave the registry's
/// breaker closed — one that opens on the first failure it counts — and another image on the
/// same registry still resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_indexes_cost_a_bounded_number_of_requests_and_never_open_the_breaker() {
    let hostile = HostileRegistry::start();
    let mut settings = settings_for(&hostile.host);
    settings.breaker.failures = 1;
    let resolver = Resolver::new(settings.clone(), CredentialStore::default()).unwrap();
    for i in 0..5 {
        let image = format!("{}/evil/nested{i}:v1", hostile.host);
        let err = resolver.resolve(&image).await.unwrap_err();
        assert!(matches!(err, LookupError::OverLimit { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.starts_with(&image), "{text}");
        assert!(text.contains("more than 64 manifests and blobs"), "{text}");
    }
    let good = format!("{}/good/app:v1", hostile.host);
    let found = resolver.resolve(&good).await.unwrap();
    assert_eq!(found.fact.platforms.len(), 1);

    // Through the webhook: allowed unchanged, each image named with the bound it reached.
    let server = TestServer::start(webhook::policy(), settings).await;
    let images: Vec<String> = (5..10)
        .map(|i| format!("{}/evil/nested{i}:v1", hostile.host))
        .collect();
    allowed_unchanged_naming_each(&server, &images, |image, w| {
        w.contains(image) && w.contains("too costly to look up")
    })
    .await;
    let metrics = webhook::metrics_text(&server).await;
    assert_eq!(
        metric_sum(&metrics, "tolerable_registry_circuit_opened_total"),
        0.0,
        "{metrics}"
    );
    let (response, _) = admit(&server, &pod_with_images(&[good])).await;
    assert!(response.get("patch").is_some(), "{response}");

    for i in 0..10 {
        let asked = hostile.requests_for(&format!("evil/nested{i}"));
        let total: usize = asked.values().sum();
        eprintln!("evil/nested{i}: {total} registry requests");
        assert!(total <= 128, "{total} requests for one lookup");
        let twice: Vec<_> = asked.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "asked more than once: {twice:?}");
    }
}

/// Children that send 4 MiB − 2 bytes and stall: a lookup holds at most its share of the
/// registry bytes, ends as the image's own failure inside the admission's deadline (not the
/// registry's: its breaker, opening on the first failure it counts, stays closed), and gives
/// every byte back — for one image and for sixteen in one Pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_children_hold_at_most_a_share_and_give_it_back() {
    let hostile = HostileRegistry::start();
    let mut settings = settings_for(&hostile.host);
    settings.breaker.failures = 1;
    let server = TestServer::start(webhook::policy(), settings).await;
    let image = format!("{}/evil/stalled:v1", hostile.host);
    allowed_unchanged_naming_each(&server, std::slice::from_ref(&image), |image, w| {
        w.contains(image)
            && w.contains("too costly to look up: more than 5 MiB of manifests and blobs in flight")
    })
    .await;
    assert_eq!(registry_bytes_drained(&server).await, 0.0);
    let requested = hostile.requests_for("evil/stalled");
    assert!(
        requested.len() <= 1 + 4 && requested.values().all(|n| *n == 1),
        "{requested:?}"
    );

    let images: Vec<String> = (0..16)
        .map(|i| format!("{}/evil/stalled{i}:v1", hostile.host))
        .collect();
    // The sixteen share their children (read once across lookups): a lookup that waited on
    // another's stalled read of one ends as stalled on it — the image's own failure still.
    allowed_unchanged_naming_each(&server, &images, |image, w| {
        w.contains(image)
            && (w.contains("too costly to look up")
                || w.contains("too many registry bytes in flight")
                || w.contains("stalled"))
    })
    .await;
    assert_eq!(registry_bytes_drained(&server).await, 0.0);
    let good = format!("{}/good/app:v1", hostile.host);
    let (response, _) = admit(&server, &pod_with_images(&[good])).await;
    assert!(
        response.get("patch").is_some(),
        "breaker closed: {response}"
    );
}

/// 4 Pods × 16 single images whose config blobs (each its own) stall, 64 lookups at once on one
/// registry: together they never hold more than that registry's share of the registry bytes
/// (12 MiB of the process's 32 MiB); those that find it spent wait for room and end as busy by
/// their deadline, the others as stalled; every byte is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_config_blobs_stay_within_the_process_budget() {
    let hostile = HostileRegistry::start();
    let mut settings = settings_for(&hostile.host);
    settings.lookup_timeout = Duration::from_secs(2);
    let resolver = Arc::new(Resolver::new(settings, CredentialStore::default()).unwrap());
    let most = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (resolver, most) = (resolver.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                most.fetch_max(resolver.registry_bytes_in_flight(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let lookups = (0..64).map(|i| {
        let resolver = resolver.clone();
        let image = format!("{}/evil/stallown-budget{i}:v1", hostile.host);
        async move { resolver.resolve(&image).await }
    });
    let results = futures_util::future::join_all(lookups).await;
    sampler.abort();
    let kinds: std::collections::BTreeMap<&str, usize> =
        results.iter().fold(Default::default(), |mut m, r| {
            *m.entry(r.as_ref().err().map_or("ok", LookupError::metric_label))
                .or_default() += 1;
            m
        });
    eprintln!(
        "64 stalled config blobs: {kinds:?}, at most {} bytes held",
        most.load(Ordering::SeqCst)
    );
    let expected = ["busy", "stalled", "timeout", "throttled", "circuit_open"];
    assert!(kinds.keys().all(|k| expected.contains(k)), "{kinds:?}");
    // Some lookups never held bytes: they found the registry's share (or its lookup turns)
    // spent and waited for room (busy) or were throttled, or — on a loaded machine, where the
    // stalls reach the lookup timeout first — met the breaker those timeouts opened; which one
    // depends on scheduling. How a waiter gets room is the unit test's
    // (`each_host_and_namespace_holds_its_own_share_and_waiters_get_room`).
    let refused = ["busy", "throttled", "circuit_open"].map(|k| kinds.get(k).copied().unwrap_or(0));
    assert!(refused.iter().sum::<usize>() >= 1, "{kinds:?}");
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 12 << 20, "{most} bytes held at once");
    assert!(most >= 4 << 20, "the stalled blobs were held ({most})");
    assert_eq!(resolver.registry_bytes_in_flight(), 0);
}

/// A registry naming 64 invented 110-character architectures beside arm64: only arm64 reaches
/// the answer and the patch (a required node affinity of values no node label can hold would
/// leave the Pod unschedulable, or rejected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn architectures_that_are_not_label_values_never_reach_the_patch() {
    let hostile = HostileRegistry::start();
    let settings = settings_for(&hostile.host);
    let image = format!("{}/evil/labels:v1", hostile.host);
    let resolver = Resolver::new(settings.clone(), CredentialStore::default()).unwrap();
    let found = resolver.resolve(&image).await.unwrap();
    let names: Vec<String> = found
        .fact
        .platforms
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(names, ["linux/arm64"]);

    let server = TestServer::start(webhook::policy(), settings).await;
    let (response, _) = admit(&server, &pod_with_images(&[image])).await;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .unwrap();
    let patch = String::from_utf8(patch).unwrap();
    assert!(patch.contains("arm64"), "{patch}");
    assert!(!patch.contains("invented"), "{patch}");
    assert!(!response
        .to_string()
        .contains(&hostile::invented_architecture(0)));
}

/// Config blobs the registry answers at once (200, headers) and then stalls, each within its
/// lookup's 5 MiB share: every lookup holding one ends as the image's own failure naming the
/// blob — by the lookup's deadline, or by the read timeout — those waiting for room in the
/// registry's share as busy, and the registry's breaker (set to open on the
/// first failure it counts) never counts one, so five such images leave it closed for every
/// other tenant, and another image there is still looked up. (A registry that does not answer
/// at all still opens it: `tests/webhook/faults.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_config_blobs_are_the_images_failure_and_never_open_the_breaker() {
    let hostile = HostileRegistry::start();
    let mut settings = settings_for(&hostile.host);
    settings.breaker.failures = 1;
    settings.lookup_timeout = Duration::from_secs(1);
    let stalled = |image: &str| {
        format!(
            "{image}: the registry's answer for {} stalled",
            hostile::stalled_config_digest()
        )
    };
    let resolver = Arc::new(Resolver::new(settings.clone(), CredentialStore::default()).unwrap());
    let images: Vec<String> = (0..5)
        .map(|i| format!("{}/evil/stallcfg-own{i}:v1", hostile.host))
        .collect();
    let results =
        futures_util::future::join_all(images.iter().map(|image| resolver.resolve(image))).await;
    // Five 4 MiB blobs do not fit the registry's 12 MiB share of the registry bytes: those that
    // found no room waited for it — busy if none came by their deadline (issue 34), stalled if
    // they got it from a lookup that ended a moment before — never counted by the breaker.
    let mut stalled_ones = 0;
    for (image, result) in images.iter().zip(results) {
        match result.unwrap_err() {
            err @ LookupError::Stalled { .. } => {
                assert_eq!(err.to_string(), stalled(image));
                stalled_ones += 1;
            }
            LookupError::Busy { .. } => {}
            err => panic!("{err:?}"),
        }
    }
    assert!(stalled_ones >= 1, "none stalled");
    let good = format!("{}/good/app:v1", hostile.host);
    let found = resolver.resolve(&good).await.unwrap();
    assert_eq!(found.fact.platforms.len(), 1);
    assert_eq!(resolver.registry_bytes_in_flight(), 0);

    // Stalled past the read timeout before the lookup's deadline: the same.
    let mut impatient = settings.clone();
    impatient.lookup_timeout = Duration::from_secs(3);
    impatient.transport.read_timeout = Duration::from_millis(200);
    let resolver = Resolver::new(impatient, CredentialStore::default()).unwrap();
    let image = format!("{}/evil/stallcfg-read:v1", hostile.host);
    let err = resolver.resolve(&image).await.unwrap_err();
    assert_eq!(err.to_string(), stalled(&image), "{err:?}");
    resolver.resolve(&good).await.unwrap();

    // Through the webhook: allowed unchanged, each image named with its stalled blob; the
    // breaker never opened, and the ordinary image gets its patch.
    let server = TestServer::start(webhook::policy(), settings).await;
    let images: Vec<String> = (0..5)
        .map(|i| format!("{}/evil/stallcfg-hook{i}:v1", hostile.host))
        .collect();
    allowed_unchanged_naming_each(&server, &images, |image, w| {
        w.contains(&stalled(image))
            || w.contains(&format!(
                "{image}: not looked up: too many registry bytes in flight"
            ))
    })
    .await;
    let metrics = webhook::metrics_text(&server).await;
    assert_eq!(
        metric_sum(&metrics, "tolerable_registry_circuit_opened_total"),
        0.0,
        "{metrics}"
    );
    assert_eq!(registry_bytes_drained(&server).await, 0.0);
    let (response, _) = admit(&server, &pod_with_images(&[good])).await;
    assert!(
        response.get("patch").is_some(),
        "breaker closed: {response}"
    );
}

/// The namespace of the Pod an AdmissionReview creates.
fn in_namespace(mut review: Value, namespace: &str) -> Value {
    review["request"]["namespace"] = json!(namespace);
    review["request"]["object"]["metadata"]["namespace"] = json!(namespace);
    review
}

/// The manifest `repository:tag` on the plain test registry, as it serves it.
async fn served_manifest(repository: &str, tag: &str) -> Vec<u8> {
    let url = format!(
        "http://{}/v2/{repository}/manifests/{tag}",
        registry::plain().host
    );
    let response = reqwest::Client::new()
        .get(url)
        .header("accept", common::fixtures::OCI_INDEX)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap().to_vec()
}

/// On the plain test registry, `repository`: tags `t0`…`t{tags - 1}`, each an index naming
/// (without a platform) one nested index, which names a linux/arm64 image: many images that
/// share their children.
async fn push_images_sharing_one_nested_index(repository: &str, tags: usize) {
    let host = &registry::plain().host;
    let pusher = common::fixtures::Pusher::for_mode(host, common::registry::Mode::Plain);
    pusher.push_nested(repository, "nested", 1).await;
    let nested = served_manifest(repository, "nested").await;
    let top = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": common::fixtures::OCI_INDEX,
        "manifests": [{
            "mediaType": common::fixtures::OCI_INDEX,
            "digest": common::fixtures::sha256(&nested),
            "size": nested.len(),
        }],
    }))
    .unwrap();
    common::fixtures::push_index_tags(host, repository, &top, 0..tags, 8).await;
}

/// Issue 34: a 100-image Pod whose images share one nested index costs the registry one GET
/// per image and one per shared child — at most 128 requests in all (each child was read by
/// every lookup that reached it: 5,695 GETs) — and every image is learned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_images_sharing_one_nested_index_cost_at_most_128_registry_requests() {
    let repository = format!("shared-children-{}", common::free_port());
    push_images_sharing_one_nested_index(&repository, 100).await;
    let server = TestServer::start(webhook::policy(), common::settings()).await;
    let images: Vec<String> = (0..100)
        .map(|i| format!("{}/{repository}:t{i}", registry::plain().host))
        .collect();
    let (response, _) = admit(&server, &pod_with_images(&images)).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_some(), "{response}");
    assert!(warnings(&response).is_empty(), "{response}");
    let (manifests, blobs) = registry::plain().requests_for(&repository).await;
    eprintln!("100 images over one nested index: {manifests} manifest and {blobs} blob requests");
    assert!(manifests + blobs <= 128, "{manifests} + {blobs} requests");
    assert!(
        manifests >= 100,
        "each image's own index is read: {manifests}"
    );
}

/// Keeps posting Pods in namespace `attacker`, each naming 8 images on `hostile` whose config
/// blobs (4 MiB − 1 declared, 4 MiB − 2 sent) stall, with fresh tags every round, until `stop`.
/// Returns how many were answered, and how many of those were denied.
fn stalled_blob_attack(
    url: String,
    hostile: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(usize, usize)> {
    tokio::spawn(async move {
        let (mut answered, mut denied) = (0, 0);
        for round in 0.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let images: Vec<String> = (0..8)
                .map(|k| format!("{hostile}/evil/stallown-a2-{round}-{k}:v1"))
                .collect();
            let review = in_namespace(pod_with_images(&images), "attacker");
            let (status, body) = webhook::admit_owned(url.clone(), review).await;
            assert_eq!(status, 200);
            answered += 1;
            denied += usize::from(body["response"]["allowed"] == false);
        }
        (answered, denied)
    })
}

/// Waits until the server holds at least `bytes` of registry answers (an attack has begun to
/// hold its share); panics after 10 s.
async fn registry_bytes_reach(server: &TestServer, bytes: f64) {
    for _ in 0..200 {
        let held = metric_sum(
            &webhook::metrics_text(server).await,
            "tolerable_registry_bytes_in_flight",
        );
        if held >= bytes {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the attack never held {bytes} registry bytes");
}

/// Issue 34, the A2 attack: Pods of one namespace name 8 images each whose config blobs stall
/// after 4 MiB − 2 bytes, re-posted with fresh tags. Their registry's share of the registry
/// bytes (12 MiB) is all they hold; meanwhile other namespaces' Pods, whose images on the real
/// registry are each a fresh lookup, are every one answered with their images learned — under
/// `on_lookup_failure = "deny"` none is denied — and the attacker's own lookups end as its
/// images' failures (stalled, or busy waiting for room in its registry's share), never
/// counted by a breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_namespaces_stalled_config_blobs_leave_other_namespaces_lookups_answered() {
    let hostile = HostileRegistry::start();
    let repository = format!("victims-{}", common::free_port());
    const VICTIMS: usize = 40;
    push_images_sharing_one_nested_index(&repository, VICTIMS).await;
    let mut settings = settings_for(&hostile.host);
    settings.breaker.failures = 1;
    let policy = tolerable::mutate::Policy {
        on_lookup_failure: OnLookupFailure::Deny,
        ..webhook::policy()
    };
    let server = TestServer::start(policy, settings).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let url = server.url(&format!("/mutate?timeout={DEADLINE_SECS}s"));
    let attacks: Vec<_> = (0..2)
        .map(|_| stalled_blob_attack(url.clone(), hostile.host.clone(), stop.clone()))
        .collect();
    registry_bytes_reach(&server, f64::from(8 << 20)).await;

    let (mut learned, mut denied, mut most_held) = (0, 0, 0.0_f64);
    for i in 0..VICTIMS {
        let image = format!("{}/{repository}:t{i}", registry::plain().host);
        let review = in_namespace(pod_with_images(&[image]), &format!("victim-{i}"));
        let (response, _) = admit(&server, &review).await;
        denied += usize::from(response["allowed"] == false);
        learned += usize::from(response.get("patch").is_some());
        let metrics = webhook::metrics_text(&server).await;
        most_held = most_held.max(metric_sum(&metrics, "tolerable_registry_bytes_in_flight"));
    }
    stop.store(true, Ordering::Relaxed);
    let mut attacker = (0, 0);
    for attack in attacks {
        let (answered, refused) = attack.await.unwrap();
        attacker = (attacker.0 + answered, attacker.1 + refused);
    }
    eprintln!(
        "A2: {learned} of {VICTIMS} victims learned, {denied} denied; attacker Pods: {} answered, \
         {} denied; at most {most_held} registry bytes held",
        attacker.0, attacker.1
    );
    assert_eq!(denied, 0, "victims denied");
    assert!(learned * 100 >= VICTIMS * 95, "{learned} of {VICTIMS}");
    assert!(
        most_held <= f64::from((12 << 20) + (1 << 20)),
        "{most_held} bytes: more than the attacker's registry's share and the victims'"
    );
    assert!(attacker.0 >= 2 && attacker.1 == attacker.0, "{attacker:?}");
    let metrics = webhook::metrics_text(&server).await;
    assert_eq!(
        metric_sum(&metrics, "tolerable_registry_circuit_opened_total"),
        0.0,
        "{metrics}"
    );
    assert!(
        metric_sum(&metrics, "tolerable_registry_bytes_waits_total") >= 1.0,
        "the attacker's lookups waited for room: {metrics}"
    );
    assert_eq!(registry_bytes_drained(&server).await, 0.0);
}
