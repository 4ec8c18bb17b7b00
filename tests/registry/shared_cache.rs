//! The shared cache (`cache_url`) on a real `redis-server`, with the real registry behind:
//! replicas share what any of them learned (a registry is asked once for the whole cluster), a
//! restarted replica starts warm, keys carry no credential, and a killed, frozen or restarted
//! Redis never fails an admission — the in-memory cache and the registry answer alone, within
//! the budget, and the shared cache is used again once it answers. `rediss://` is a Redis that
//! speaks only TLS: shared when its CA is trusted, failing open when it is not; and the log
//! warns once per outage, without the password.

use crate::common;

use std::time::{Duration, Instant};

use common::fixtures::Pusher;
use common::redis::RedisServer;
use common::registry::{self, Mode, Requests};
use common::webhook::{self, TestServer};
use serde_json::{json, Value};
use tolerable::registry::{
    CredentialStore, LookupError, Resolver, ResolverSettings, SharedCacheSettings,
};

fn settings(redis: &RedisServer) -> ResolverSettings {
    let mut settings = common::settings();
    settings.shared_cache = Some(redis.settings());
    settings
}

/// A replica: its own in-memory cache, the shared one on `redis`.
fn replica(redis: &RedisServer) -> Resolver {
    Resolver::new(settings(redis), CredentialStore::default()).unwrap()
}

async fn push(repository: &str, name: &str, tag: &str) -> String {
    Pusher::for_mode(&registry::plain().host, Mode::Plain)
        .push(repository, name, tag)
        .await
}

fn image(repository: &str, reference: &str) -> String {
    let separator = if reference.contains(':') { '@' } else { ':' };
    format!(
        "{}/{repository}{separator}{reference}",
        registry::plain().host
    )
}

fn requests(manifest_gets: usize, manifest_heads: usize, blob_gets: usize) -> Requests {
    Requests {
        manifest_gets,
        manifest_heads,
        blob_gets,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_what_one_learned_and_a_restarted_replica_starts_warm() {
    let redis = RedisServer::start();
    let registry = registry::plain();
    let repository = "shared/warm";
    let index = push(repository, "multiarch-oci", "v1").await;
    push(repository, "arm64-oci", "arm64").await;
    // A claim of a fetch is held for `lookup_timeout`: a minute here, so the claims counted in
    // Redis below are still there however slow this machine is (at 3 s they could expire
    // before the count, a race with the clock).
    let replica = |redis: &RedisServer| {
        let mut settings = settings(redis);
        settings.lookup_timeout = Duration::from_secs(60);
        Resolver::new(settings, CredentialStore::default()).unwrap()
    };
    let first = replica(&redis);
    for reference in ["v1", "arm64"] {
        first.resolve(&image(repository, reference)).await.unwrap();
    }
    let missing = first.resolve(&image(repository, "missing")).await;
    assert!(
        matches!(missing, Err(LookupError::NotFound { .. })),
        "{missing:?}"
    );
    // With a shared cache a tag is asked for its digest first (a HEAD: the digest's answer may
    // be shared already), then fetched by digest; the missing tag's HEAD is its 404.
    let learned = requests(2, 3, 1);
    assert_eq!(registry.requests_by_method(repository).await, learned);

    // Another replica, and one started after the first is gone (a restart, a rollout): the
    // same answers, the same failure, and not one registry request.
    drop(first);
    for _ in 0..2 {
        let other = replica(&redis);
        let found = other.resolve(&image(repository, "v1")).await.unwrap();
        assert_eq!(found.digest, index);
        assert_eq!(found.fact.platforms.len(), 3);
        other.resolve(&image(repository, "arm64")).await.unwrap();
        other.resolve(&image(repository, &index)).await.unwrap();
        let missing = other.resolve(&image(repository, "missing")).await;
        assert!(
            matches!(missing, Err(LookupError::NotFound { .. })),
            "{missing:?}"
        );
    }
    assert_eq!(registry.requests_by_method(repository).await, learned);

    // What Redis holds: tags, digests, the failure — no credential, no password.
    let keys = redis.keys();
    let ours: Vec<&String> = keys.iter().filter(|k| k.contains(repository)).collect();
    // 2 tags, 2 digests, 1 failure, and the 2 claims of the fetches (held for a minute).
    assert_eq!(ours.len(), 7, "{ours:?}");
    assert!(
        ours.iter().all(|k| k.starts_with("tolerable:v1:")),
        "{ours:?}"
    );
}

/// Keys carry the credential's identity, not the credential; a replica with other credentials
/// does not share the answer, one with the same does — and the password of a Redis that asks
/// for one is never in a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_carry_the_credential_identity_never_the_credential() {
    let redis = RedisServer::start_with_password(Some("redis-pass-123"));
    let registry = registry::basic();
    let repository = "shared/private";
    Pusher::for_mode(&registry.host, Mode::Basic)
        .push(repository, "multiarch-oci", "v1")
        .await;
    let store = |user: &str, secret: &str| {
        let dir = tempfile::tempdir().unwrap();
        let file = format!("{}.toml", registry.host.replace(':', "_"));
        std::fs::write(
            dir.path().join(file),
            format!("user = \"{user}\"\nsecret = \"{secret}\"\n"),
        )
        .unwrap();
        (CredentialStore::load_dir(dir.path()).unwrap(), dir)
    };
    let image = format!("{}/{repository}:v1", registry.host);
    let (good, _a) = store(registry::USER, registry::PASSWORD);
    let first = Resolver::new(settings(&redis), good.clone()).unwrap();
    first.resolve(&image).await.unwrap();
    // The challenge (401 to a HEAD), the HEAD with the credential, the GET by digest.
    let asked = registry.requests_by_method(repository).await;
    assert_eq!(asked, requests(1, 2, 0));
    let same = Resolver::new(settings(&redis), good).unwrap();
    same.resolve(&image).await.unwrap();
    assert_eq!(registry.requests_by_method(repository).await, asked);
    let (wrong, _b) = store(registry::USER, "not-the-password");
    let other = Resolver::new(settings(&redis), wrong).unwrap();
    assert!(
        other.resolve(&image).await.is_err(),
        "another credential, another key"
    );
    let keys = redis.keys().join("\n");
    for secret in [
        registry::USER,
        registry::PASSWORD,
        "not-the-password",
        "redis-pass-123",
    ] {
        assert!(!keys.contains(secret), "{secret} in\n{keys}");
    }
}

/// The recorded Pod CREATE naming `image`.
fn admission_for(image: &str) -> Value {
    let mut request = webhook::recorded("pod-create-simple.v1.json", "unused");
    request["request"]["object"]["spec"]["containers"][0]["image"] = json!(image);
    request
}

const DEADLINE: Duration = Duration::from_secs(3);

/// Admits `image` and checks it was patched (the registry answered, whatever Redis did) in
/// time: a lookup past its deadline (`lookup_timeout`) ends unpatched with a warning, so a
/// patch without one is the deadline kept — by the server's own clock, not the test's.
/// (`DEADLINE` only bounds a hung test.)
async fn admitted(server: &TestServer, image: &str) {
    let (response, _) = webhook::admit(server, &admission_for(image), DEADLINE).await;
    assert!(response["patch"].is_string(), "{response}");
    assert!(webhook::warnings(&response).is_empty(), "{response}");
}

/// `needle` in the server's metrics, waiting for at most 5 s (a reconnection takes its time).
async fn metric_shows(server: &TestServer, needle: &str) {
    let started = Instant::now();
    loop {
        let metrics = webhook::metrics_text(server).await;
        if metrics.contains(needle) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{needle} missing:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Redis is read from again too: a fresh replica (empty memory) resolves `written`, a tag a
/// server wrote after Redis came back, from Redis, without one registry request.
async fn read_from_again(redis: &RedisServer, written: &str) {
    let repository = "shared/outage";
    let asked = registry::plain().requests_by_method(repository).await;
    let found = replica(redis).resolve(written).await.unwrap();
    assert_eq!(found.fact.platforms.len(), 3);
    assert_eq!(
        registry::plain().requests_by_method(repository).await,
        asked,
        "answered from Redis"
    );
}

/// Redis killed, frozen, restarted empty: every admission is answered in time and patched,
/// from the registry; the metrics count errors and skipped lookups; once Redis answers again
/// it is written to and read from as before, without a restart of tolerable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_or_frozen_redis_fails_open_and_is_used_again_once_back() {
    let redis = RedisServer::start();
    let repository = "shared/outage";
    for tag in ["a", "b", "c", "d", "e"] {
        push(repository, "multiarch-oci", tag).await;
    }
    let mut resolver_settings = settings(&redis);
    resolver_settings.lookup_timeout = Duration::from_secs(2);
    let server = TestServer::start(webhook::policy(), resolver_settings).await;
    admitted(&server, &image(repository, "a")).await;
    metric_shows(
        &server,
        "tolerable_shared_cache_writes_total{result=\"ok\"} 1\n",
    )
    .await;
    metric_shows(&server, "tolerable_shared_cache_up 1\n").await;

    redis.kill();
    admitted(&server, &image(repository, "b")).await;
    metric_shows(
        &server,
        "tolerable_shared_cache_lookups_total{result=\"error\"} 1\n",
    )
    .await;
    metric_shows(&server, "tolerable_shared_cache_up 0\n").await;
    // Within a second of the failure it is not even asked.
    admitted(&server, &image(repository, "c")).await;
    metric_shows(
        &server,
        "tolerable_shared_cache_lookups_total{result=\"skipped\"}",
    )
    .await;

    redis.restart();
    // It reconnects by itself: keep admitting new tags until a write lands.
    let started = Instant::now();
    let mut tag = 0;
    while !redis.keys().iter().any(|k| k.contains(repository)) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never reconnected"
        );
        let pushed = format!("again{tag}");
        push(repository, "multiarch-oci", &pushed).await;
        admitted(&server, &image(repository, &pushed)).await;
        tag += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    metric_shows(&server, "tolerable_shared_cache_up 1\n").await;
    read_from_again(&redis, &image(repository, &format!("again{}", tag - 1))).await;

    // Frozen: connections hang. The lookup waits only its share of the budget, then asks the
    // registry: the bound the code guarantees is the lookup's own deadline (lookup_timeout,
    // 2 s), past which it would end as a timeout, unpatched, with a warning — `admitted` checks
    // it was patched, without a warning. And the frozen Redis was asked (and given up on),
    // not skipped: one more lookup counted as an error.
    let errors = |metrics: &str| {
        webhook::metric_value(
            metrics,
            "tolerable_shared_cache_lookups_total{result=\"error\"}",
        )
        .unwrap_or(0.0)
    };
    let errors_before = errors(&webhook::metrics_text(&server).await);
    redis.freeze();
    admitted(&server, &image(repository, "d")).await;
    assert_eq!(
        errors(&webhook::metrics_text(&server).await),
        errors_before + 1.0,
        "the frozen Redis was not asked"
    );
    redis.thaw();
    metric_shows(&server, "tolerable_shared_cache_up 0\n").await;
}

/// `rediss://` to a Redis that speaks only TLS and asks for a password, its CA trusted
/// (`cache_ca_path`): a second replica answers from what the first wrote, without a registry
/// request. With the wrong password over the same TLS it is refused, and the registry answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_its_ca_and_password_is_shared_by_replicas() {
    let redis = RedisServer::start_tls(Some("tls-pass-456"));
    assert!(
        redis.url().starts_with("rediss://127.0.0.1:"),
        "{}",
        redis.url()
    );
    let registry = registry::plain();
    let repository = "shared/tls";
    let index = push(repository, "multiarch-oci", "v1").await;
    let reference = image(repository, "v1");
    replica(&redis).resolve(&reference).await.unwrap();
    // The HEAD for the tag's digest, the GET by digest.
    let learned = requests(1, 1, 0);
    assert_eq!(registry.requests_by_method(repository).await, learned);
    for _ in 0..2 {
        let found = replica(&redis).resolve(&reference).await.unwrap();
        assert_eq!(found.digest, index);
        assert_eq!(found.fact.platforms.len(), 3);
    }
    assert_eq!(registry.requests_by_method(repository).await, learned);

    let ca = common::certs::ca().ca_pem.as_bytes().to_vec();
    let wrong =
        SharedCacheSettings::new(&redis.url(), Some("not-the-password".into()), Some(ca)).unwrap();
    let mut refused = common::settings();
    refused.shared_cache = Some(wrong);
    let refused = Resolver::new(refused, CredentialStore::default()).unwrap();
    let found = refused.resolve(&reference).await.unwrap();
    assert_eq!(found.digest, index);
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(2, 2, 0)
    );
}

/// `rediss://` to a Redis whose certificate another CA signed, or trusting only the system's
/// roots: the TLS handshake fails, every admission is patched from the registry, and the
/// metrics count the error and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_another_ca_or_none_fails_open() {
    let redis = RedisServer::start_tls(None);
    let registry = registry::plain();
    let repository = "shared/tls-untrusted";
    let another_ca = common::certs::TestCa::new().ca_pem;
    for (tag, ca) in [
        ("another-ca", Some(another_ca.as_str())),
        ("system-roots", None),
    ] {
        push(repository, "multiarch-oci", tag).await;
        let before = registry.requests_by_method(repository).await;
        let mut resolver_settings = common::settings();
        resolver_settings.shared_cache = Some(redis.settings_trusting(ca));
        let server = TestServer::start(webhook::policy(), resolver_settings).await;
        admitted(&server, &image(repository, tag)).await;
        metric_shows(
            &server,
            "tolerable_shared_cache_lookups_total{result=\"error\"} 1\n",
        )
        .await;
        metric_shows(&server, "tolerable_shared_cache_up 0\n").await;
        let metrics = webhook::metrics_text(&server).await;
        assert!(
            !metrics.contains("tolerable_shared_cache_lookups_total{result=\"hit\"}")
                && !metrics.contains("tolerable_shared_cache_writes_total{result=\"ok\"}"),
            "{tag}: {metrics}"
        );
        let after = registry.requests_by_method(repository).await;
        assert_eq!(after.manifest_gets, before.manifest_gets + 1, "{tag}");
    }
}

/// The real binary (`tolerable inspect`, a new process each run: a restarted replica), its
/// shared cache configured as an operator does — `TOLERABLE_SHARED_CACHE__URL`, `_PASSWORD`,
/// `_CA_PATH` — on a TLS Redis: shared across runs; without the CA, or with Redis killed, every
/// image is still answered and the log has one warning for the outage, naming the cache, never
/// the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_warns_once_per_outage_and_never_shows_the_password() {
    const PASSWORD: &str = "tls-log-pass-321";
    let redis = RedisServer::start_tls(Some(PASSWORD));
    let registry = registry::plain();
    let repository = "shared/log";
    let mut images = Vec::new();
    // Three indexes, three digests: nothing is coalesced.
    for fixture in ["multiarch-oci", "multiarch-docker", "buildx-single"] {
        push(repository, fixture, fixture).await;
        images.push(image(repository, fixture));
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("redis-ca.pem");
    std::fs::write(&ca, &common::certs::ca().ca_pem).unwrap();
    let inspect = |ca: Option<&std::path::Path>| {
        let mut command = common::cli::tolerable();
        command
            .args(["inspect", "--json"])
            .args(&images)
            .env("TOLERABLE_SHARED_CACHE__URL", redis.url())
            .env("TOLERABLE_SHARED_CACHE__PASSWORD", PASSWORD);
        if let Some(ca) = ca {
            command.env("TOLERABLE_SHARED_CACHE__CA_PATH", ca);
        }
        let out = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
            "the password is in the output"
        );
        assert!(out.status.success(), "{stdout}{stderr}");
        let items: Vec<Value> = serde_json::from_str(&stdout).unwrap();
        assert_eq!(items.len(), images.len(), "{stdout}");
        stderr
            .lines()
            .filter(|l| l.contains("shared cache unavailable"))
            .map(str::to_owned)
            .collect::<Vec<String>>()
    };
    assert_eq!(inspect(Some(&ca)), Vec::<String>::new());
    let learned = requests(3, 3, 0);
    assert_eq!(registry.requests_by_method(repository).await, learned);
    // Another process, the same Redis: every answer from it.
    assert_eq!(inspect(Some(&ca)), Vec::<String>::new());
    assert_eq!(registry.requests_by_method(repository).await, learned);

    // The system's roots do not trust the test CA: the handshake fails. Each of the three
    // lookups fails at Redis; the log warns once.
    let untrusted = inspect(None);
    assert_eq!(untrusted.len(), 1, "{untrusted:#?}");
    assert!(untrusted[0].contains(&redis.url()), "{}", untrusted[0]);
    assert!(untrusted[0].contains("certificate"), "{}", untrusted[0]);
    redis.kill();
    let down = inspect(Some(&ca));
    assert_eq!(down.len(), 1, "{down:#?}");
    assert!(down[0].contains(&redis.url()), "{}", down[0]);
    // Both runs asked the registry for every image.
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(9, 9, 0)
    );
}

/// `cache_url` through the configuration: a password in the URL or from a file is never in an
/// error; a password in the config file is refused.
#[test]
fn cache_url_configuration_never_shows_the_password() {
    let load = |vars: &[(&str, &str)]| {
        tolerable::config::Config::load(
            None,
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
    };
    let config = load(&[
        ("TOLERABLE_SHARED_CACHE__URL", "redis://127.0.0.1:6390/1"),
        ("TOLERABLE_SHARED_CACHE__PASSWORD", "pa55word"),
    ])
    .unwrap();
    assert!(config.resolver.shared_cache.is_some());
    assert!(!format!("{config:?}").contains("pa55word"));
    let bad = load(&[(
        "TOLERABLE_SHARED_CACHE__URL",
        "redis://:pa55word@127.0.0.1:6390/x",
    )])
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("TOLERABLE_SHARED_CACHE__URL") && !bad.contains("pa55word"),
        "{bad}"
    );
    let stray = load(&[("TOLERABLE_SHARED_CACHE__PASSWORD", "pa55word")])
        .unwrap_err()
        .to_string();
    assert!(
        stray.contains("shared_cache.password") && !stray.contains("pa55word"),
        "{stray}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tolerable.toml");
    std::fs::write(
        &file,
        "cache_url = \"redis://127.0.0.1:6390/0\"\ncache_password = \"pa55word\"\n",
    )
    .unwrap();
    let err = tolerable::config::Config::load(Some(&file), Vec::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("TOLERABLE_SHARED_CACHE__PASSWORD") && !err.contains("pa55word"),
        "{err}"
    );
    let password = dir.path().join("password");
    std::fs::write(&password, "pa55word\n").unwrap();
    let config = load(&[
        ("TOLERABLE_SHARED_CACHE__URL", "rediss://cache.example:6380"),
        (
            "TOLERABLE_SHARED_CACHE__PASSWORD_FILE",
            password.to_str().unwrap(),
        ),
    ])
    .unwrap();
    assert!(!format!("{config:?}").contains("pa55word"));
}
