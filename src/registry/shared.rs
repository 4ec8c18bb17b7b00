//! The shared cache (`cache_url`): Redis or Valkey behind the in-memory cache, a second level
//! every replica reads before asking a registry and writes what it learned to — an answer by
//! digest for `cache_digest_ttl`, a tag's digest for what is left of its `cache_tag_ttl`, an
//! authoritative failure for `cache_failure_ttl` — so a cluster asks a registry once per tag and
//! TTL, and a restarted replica starts warm.
//!
//! It may only ever help: every request is bounded by a share of the lookup's budget
//! ([`crate::budget::shared_cache_share`]); a failed or slow one leaves the lookup to the
//! in-memory cache and the registry, logs a warning (once per outage), counts an error, and the
//! shared cache is not asked again for [`RETRY_AFTER`]. The connection is made on first use and
//! remade by itself (redis' `ConnectionManager`).
//!
//! Keys name the reference and the credentials tried, as the in-memory cache's keys do — by an
//! identity derived from each credential that cannot be turned back into it (PBKDF2, salted
//! with the shared cache's password), never the credential.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::IntoConnectionInfo as _;

use super::cache::{CacheSettings, Learned};
use super::clock::Clock;
use super::{Credential, ImagePlatforms, ImageReference, LookupError, RegistryObserver};

mod value;

pub(crate) use value::SharedFailure;

/// How long the shared cache is left alone after a request to it failed.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest any request to the shared cache may take, whatever the budget (a backstop: the
/// budget's share is what bounds a lookup).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Values larger than this are not ours (an answer is a few hundred bytes).
const MAX_VALUE_BYTES: usize = 64 << 10;
/// Key prefix; the version changes with the values' format.
const PREFIX: &str = "tolerable:v1:";
/// How often a replica waiting for another's fetch looks for its answer.
const POLL: Duration = Duration::from_millis(20);
/// Credential identities remembered per process (each costs a key derivation to compute).
const MAX_IDENTITIES: usize = 4096;
/// PBKDF2 rounds for a credential's identity: a few milliseconds once per credential, and as
/// much per guess for anyone trying to recover a credential from a key.
const IDENTITY_ROUNDS: u32 = 10_000;

/// Where the shared cache is and how to log in to it. Its `Debug` shows no password.
#[derive(Clone)]
pub struct SharedCacheSettings {
    /// `redis://` or `rediss://` (or `valkey://`, `valkeys://`) `host:port/db`, no password.
    url: String,
    password: Option<String>,
    /// Roots to trust for `rediss://` instead of the system's (PEM).
    ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for SharedCacheSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCacheSettings")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

impl SharedCacheSettings {
    /// Checks `url`; a password in it is taken out (and must not also be given as `password`).
    /// The error says what is wrong without repeating the password.
    pub fn new(
        url: &str,
        password: Option<String>,
        ca_pem: Option<Vec<u8>>,
    ) -> Result<Self, String> {
        let mut parsed = reqwest::Url::parse(url.trim())
            .map_err(|e| format!("{:?} is not a URL: {e}", redacted(url)))?;
        let shown = redacted(url);
        if !matches!(parsed.scheme(), "redis" | "rediss" | "valkey" | "valkeys") {
            return Err(format!(
                "{shown:?}: the scheme must be redis://, rediss:// (TLS), valkey:// or valkeys://"
            ));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("{shown:?} names no host"));
        }
        let path = parsed.path().trim_start_matches('/');
        if !path.is_empty() && path.parse::<u16>().is_err() {
            return Err(format!(
                "{shown:?}: the path must be a database number (/0)"
            ));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(format!("{shown:?}: no query or fragment is taken"));
        }
        let in_url = parsed
            .password()
            .map(|p| percent_decode(p).unwrap_or_else(|| p.to_owned()));
        let password = match (in_url, password) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{shown:?} has a password, and one is configured besides: give it once"
                ))
            }
            (in_url, configured) => in_url.or(configured).filter(|p| !p.is_empty()),
        };
        let _ = parsed.set_password(None);
        Ok(Self {
            url: parsed.to_string(),
            password,
            ca_pem,
        })
    }

    /// The URL as logs may show it (it never holds the password).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether a client can be made from these settings (the TLS roots parse).
    pub(crate) fn check(&self) -> Result<(), String> {
        self.client().map(drop)
    }

    /// The redis client: the URL's address and database, the password, the trusted roots (also
    /// the crash watch's learned store, `crate::crashes::shared`).
    pub(crate) fn client(&self) -> Result<redis::Client, String> {
        let mut info = self
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| format!("{}: {e}", self.url))?;
        if let Some(password) = &self.password {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        match &self.ca_pem {
            None => redis::Client::open(info),
            Some(pem) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
        }
        .map_err(|e| format!("{}: {e}", self.url))
    }
}

impl SharedCacheSettings {
    /// `text` without the password, should an error ever repeat it.
    pub(crate) fn scrub(&self, text: &str) -> String {
        match &self.password {
            Some(password) if !password.is_empty() => text.replace(password.as_str(), "***"),
            _ => text.to_owned(),
        }
    }
}

/// `url` with any password replaced by `***`, for messages.
pub(crate) fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url.trim()) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.trim().to_owned(),
        // Not a URL: a password cannot be told apart, so only its shape is shown.
        Err(_) => match url.split_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.trim().to_owned(),
        },
    }
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What the shared cache knew of a lookup.
pub(crate) enum Shared {
    /// An answer (a tag's: fresh for what is left of its TTL there).
    Found(Learned),
    /// An authoritative failure another replica saw a moment ago.
    Failed(LookupError),
    /// Nothing, or the shared cache could not be asked.
    Miss,
}

/// The keys of one lookup in the shared cache.
pub(crate) struct Keys {
    /// `tag:<reference>#<identities>` for a tag; `None` for a digest reference.
    tag: Option<String>,
    /// `digest:<registry/repository>@` … `#<identities>`: the digest goes between.
    digest_prefix: String,
    /// `fetching:<registry/repository>@` …: a replica fetching that digest now.
    claim_prefix: String,
    identities: String,
    /// The answer by digest for a digest reference.
    pinned: Option<String>,
    failure: String,
}

impl Keys {
    fn digest(&self, digest: &str) -> String {
        format!("{}{digest}{}", self.digest_prefix, self.identities)
    }

    fn claim(&self, digest: &str) -> String {
        format!("{}{digest}{}", self.claim_prefix, self.identities)
    }
}

/// Whether the shared cache was reachable lately, and since when it is worth asking again.
struct Health {
    up: bool,
    retry_at: Option<Instant>,
}

pub(crate) struct SharedCache {
    settings: SharedCacheSettings,
    client: redis::Client,
    connection: OnceLock<Option<ConnectionManager>>,
    /// Salt of the credential identities: fixed text and the password.
    salt: Vec<u8>,
    identities: Mutex<HashMap<u64, String>>,
    health: Mutex<Health>,
    clock: Arc<dyn Clock>,
    observer: Option<Arc<dyn RegistryObserver>>,
}

impl SharedCache {
    /// Checks the settings (the TLS roots parse); connects on first use.
    pub(crate) fn new(
        settings: SharedCacheSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let client = settings.client()?;
        let mut salt = b"tolerable shared cache credential identity v1\0".to_vec();
        salt.extend(settings.password.as_deref().unwrap_or_default().as_bytes());
        Ok(Self {
            settings,
            client,
            connection: OnceLock::new(),
            salt,
            identities: Mutex::default(),
            health: Mutex::new(Health {
                up: true,
                retry_at: None,
            }),
            clock,
            observer: None,
        })
    }

    pub(crate) fn set_observer(&mut self, observer: Arc<dyn RegistryObserver>) {
        self.observer = Some(observer);
    }

    /// The keys of `reference` asked with `chain` (whose fingerprints are `fingerprints`).
    pub(crate) fn keys(
        &self,
        reference: &ImageReference,
        chain: &[Credential],
        fingerprints: &[u64],
    ) -> Keys {
        let identities: Vec<String> = chain
            .iter()
            .zip(fingerprints)
            .map(|(credential, fingerprint)| self.identity(credential, *fingerprint))
            .collect();
        let identities = format!("#{}", identities.join(","));
        let shown = reference.to_string();
        let repository = format!("{}/{}", reference.registry(), reference.repository());
        let pinned = reference
            .digest()
            .map(|digest| format!("{PREFIX}digest:{repository}@{digest}{identities}"));
        Keys {
            tag: pinned
                .is_none()
                .then(|| format!("{PREFIX}tag:{shown}{identities}")),
            digest_prefix: format!("{PREFIX}digest:{repository}@"),
            claim_prefix: format!("{PREFIX}fetching:{repository}@"),
            failure: format!("{PREFIX}failure:{shown}{identities}"),
            pinned,
            identities,
        }
    }

    /// A credential's identity in keys: PBKDF2 of its user and secret, salted with the shared
    /// cache's password, 128 bits in hex. The same on every replica; not a credential.
    fn identity(&self, credential: &Credential, fingerprint: u64) -> String {
        let mut known = self.identities.lock().expect("not poisoned");
        if let Some(identity) = known.get(&fingerprint) {
            return identity.clone();
        }
        let mut secret = credential.user().as_bytes().to_vec();
        secret.push(0);
        secret.extend(credential.secret().as_bytes());
        let mut out = [0u8; 16];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(IDENTITY_ROUNDS).expect("not zero"),
            &self.salt,
            &secret,
            &mut out,
        );
        let identity: String = out.iter().map(|b| format!("{b:02x}")).collect();
        if known.len() >= MAX_IDENTITIES {
            known.clear();
        }
        known.insert(fingerprint, identity.clone());
        identity
    }

    /// What the shared cache knows of the lookup, within `within`. `known` gives an answer by
    /// digest the in-memory cache has, so that a tag's digest needs no second request.
    pub(crate) async fn get<F>(
        &self,
        keys: &Keys,
        reference: &ImageReference,
        known: impl FnOnce(String) -> F,
        within: Duration,
    ) -> Shared
    where
        F: std::future::Future<Output = Option<Arc<ImagePlatforms>>>,
    {
        let first = self.ask(within, |mut connection| async move {
            let mut pipe = redis::pipe();
            pipe.cmd("GET").arg(&keys.failure);
            match (&keys.tag, &keys.pinned) {
                (Some(tag), _) => {
                    pipe.cmd("GET").arg(tag).cmd("PTTL").arg(tag);
                    let (failure, digest, fresh_ms) = pipe
                        .query_async::<(Option<Vec<u8>>, Option<String>, i64)>(&mut connection)
                        .await?;
                    Ok(Lookup::Tagged {
                        failure,
                        digest,
                        fresh_ms,
                    })
                }
                (None, Some(pinned)) => {
                    pipe.cmd("GET").arg(pinned);
                    let (failure, answer) = pipe
                        .query_async::<(Option<Vec<u8>>, Option<Vec<u8>>)>(&mut connection)
                        .await?;
                    Ok(Lookup::Pinned { failure, answer })
                }
                (None, None) => Ok(Lookup::Nothing),
            }
        });
        let lookup = match first.await {
            Outcome::Done(lookup) => lookup,
            Outcome::Skipped => return self.counted("skipped", Shared::Miss),
            Outcome::Failed => return self.counted("error", Shared::Miss),
        };
        let answer = self.answer_of(lookup, keys, reference, known, within).await;
        let result = match &answer {
            Shared::Found(_) | Shared::Failed(_) => "hit",
            Shared::Miss => "miss",
        };
        self.counted(result, answer)
    }

    /// Turns what the first request read into an answer, reading a tag's digest's answer when
    /// the in-memory cache does not have it.
    async fn answer_of<F>(
        &self,
        lookup: Lookup,
        keys: &Keys,
        reference: &ImageReference,
        known: impl FnOnce(String) -> F,
        within: Duration,
    ) -> Shared
    where
        F: std::future::Future<Output = Option<Arc<ImagePlatforms>>>,
    {
        let shown = reference.to_string();
        match lookup {
            Lookup::Nothing => Shared::Miss,
            Lookup::Pinned { failure, answer } => match (failure, answer) {
                (Some(failure), _) => {
                    value::failure(&failure, &shown).map_or(Shared::Miss, Shared::Failed)
                }
                (None, Some(answer)) => value::answer(&answer)
                    .map_or(Shared::Miss, |found| Shared::Found(Arc::new(found).into())),
                (None, None) => Shared::Miss,
            },
            Lookup::Tagged {
                failure: Some(failure),
                ..
            } => value::failure(&failure, &shown).map_or(Shared::Miss, Shared::Failed),
            Lookup::Tagged {
                digest: Some(digest),
                fresh_ms,
                ..
            } if fresh_ms > 0 && super::client::is_digest(&digest) => {
                let fresh_for = Some(Duration::from_millis(fresh_ms.unsigned_abs()));
                if let Some(found) = known(digest.clone()).await {
                    return Shared::Found(Learned { found, fresh_for });
                }
                let key = keys.digest(&digest);
                let read = self.ask(within, |mut connection| async move {
                    redis::cmd("GET")
                        .arg(&key)
                        .query_async::<Option<Vec<u8>>>(&mut connection)
                        .await
                });
                let read = match read.await {
                    Outcome::Done(read) => read,
                    Outcome::Skipped | Outcome::Failed => None,
                };
                match read.and_then(|v| value::answer(&v)) {
                    Some(found) if found.digest == digest => Shared::Found(Learned {
                        found: Arc::new(found),
                        fresh_for,
                    }),
                    _ => Shared::Miss,
                }
            }
            Lookup::Tagged { .. } => Shared::Miss,
        }
    }

    /// The answer for `digest` (of the lookup's repository), if the shared cache has it.
    pub(crate) async fn get_digest(
        &self,
        keys: &Keys,
        digest: &str,
        within: Duration,
    ) -> Option<ImagePlatforms> {
        let (result, found) = match self.read_digest(keys, digest, within).await {
            Outcome::Done(Some(found)) => ("hit", Some(found)),
            Outcome::Done(None) => ("miss", None),
            Outcome::Skipped => ("skipped", None),
            Outcome::Failed => ("error", None),
        };
        self.counted(result, Shared::Miss);
        found
    }

    async fn read_digest(
        &self,
        keys: &Keys,
        digest: &str,
        within: Duration,
    ) -> Outcome<Option<ImagePlatforms>> {
        let key = keys.digest(digest);
        let read = self.ask(within, |mut connection| async move {
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<Vec<u8>>>(&mut connection)
                .await
        });
        match read.await {
            Outcome::Done(value) => Outcome::Done(
                value
                    .and_then(|v| value::answer(&v))
                    .filter(|found| found.digest == digest),
            ),
            Outcome::Skipped => Outcome::Skipped,
            Outcome::Failed => Outcome::Failed,
        }
    }

    /// Claims the fetch of `digest` for this replica for `hold` (`SET NX`): false when another
    /// replica is fetching it. A shared cache that cannot be asked never stops a fetch.
    pub(crate) async fn claim(
        &self,
        keys: &Keys,
        digest: &str,
        hold: Duration,
        within: Duration,
    ) -> bool {
        let key = keys.claim(digest);
        let set = self.ask(within, |mut connection| async move {
            redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(px(hold))
                .query_async::<Option<String>>(&mut connection)
                .await
        });
        !matches!(set.await, Outcome::Done(None))
    }

    /// Waits up to `wait` for the answer for `digest` another replica is fetching.
    pub(crate) async fn wait_for(
        &self,
        keys: &Keys,
        digest: &str,
        wait: Duration,
        within: Duration,
    ) -> Option<ImagePlatforms> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            match self.read_digest(keys, digest, within).await {
                Outcome::Done(Some(found)) => {
                    self.counted("hit", Shared::Miss);
                    return Some(found);
                }
                Outcome::Done(None) if tokio::time::Instant::now() + POLL < until => {}
                _ => return None,
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Writes what a registry lookup gave: an answer by digest (and a tag's digest), or an
    /// authoritative failure; nothing for an outage. Within `within`.
    pub(crate) async fn put(
        &self,
        keys: &Keys,
        result: &Result<Arc<ImagePlatforms>, LookupError>,
        ttl: &CacheSettings,
        within: Duration,
    ) {
        let mut pipe = redis::pipe();
        let mut set = |key: &str, value: &[u8], ttl: Duration| {
            pipe.cmd("SET")
                .arg(key)
                .arg(value)
                .arg("PX")
                .arg(px(ttl))
                .ignore();
        };
        match result {
            Ok(found) => {
                set(
                    &keys.digest(&found.digest),
                    &value::encode_answer(found),
                    ttl.digest_ttl,
                );
                if let Some(tag) = &keys.tag {
                    set(tag, found.digest.as_bytes(), ttl.tag_ttl);
                }
            }
            Err(error) => match SharedFailure::of(error) {
                Some(failure) => set(
                    &keys.failure,
                    &value::encode_failure(&failure),
                    ttl.failure_ttl,
                ),
                None => return,
            },
        }
        let written = self.ask(within, |mut connection| async move {
            pipe.query_async::<()>(&mut connection).await
        });
        let result = match written.await {
            Outcome::Done(()) => "ok",
            Outcome::Skipped => "skipped",
            Outcome::Failed => "error",
        };
        if let Some(observer) = &self.observer {
            observer.shared_cache_write(result);
        }
    }

    /// Runs `request` on the connection within `within`, unless the shared cache failed less
    /// than [`RETRY_AFTER`] ago. A failure or a timeout leaves it alone for that long.
    async fn ask<T, F>(
        &self,
        within: Duration,
        request: impl FnOnce(ConnectionManager) -> F,
    ) -> Outcome<T>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        if !self.worth_asking() {
            return Outcome::Skipped;
        }
        let Some(connection) = self.connection() else {
            return Outcome::Skipped;
        };
        match tokio::time::timeout(within, request(connection)).await {
            Ok(Ok(value)) => {
                self.succeeded();
                Outcome::Done(value)
            }
            Ok(Err(e)) => {
                self.failed(&e.to_string());
                Outcome::Failed
            }
            Err(_) => {
                let waited = super::short_duration(within);
                self.failed(&format!("no answer within {waited}"));
                Outcome::Failed
            }
        }
    }

    /// The connection, made (lazily: it connects on first use, and reconnects by itself) the
    /// first time it is needed, inside the runtime.
    fn connection(&self) -> Option<ConnectionManager> {
        let made = self.connection.get_or_init(|| {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(RESPONSE_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(RETRY_AFTER);
            ConnectionManager::new_lazy_with_config(self.client.clone(), config)
                .map_err(|e| {
                    tracing::warn!(cache_url = %self.settings.url(), error = %self.clean(&e.to_string()), "shared cache not usable: using the in-memory cache alone");
                })
                .ok()
        });
        made.clone()
    }

    fn worth_asking(&self) -> bool {
        let health = self.health.lock().expect("not poisoned");
        health.retry_at.is_none_or(|at| self.clock.now() >= at)
    }

    fn succeeded(&self) {
        let mut health = self.health.lock().expect("not poisoned");
        if !health.up {
            tracing::info!(cache_url = %self.settings.url(), "shared cache reachable again");
        }
        health.up = true;
        health.retry_at = None;
        if let Some(observer) = &self.observer {
            observer.shared_cache_up(true);
        }
    }

    fn failed(&self, error: &str) {
        let mut health = self.health.lock().expect("not poisoned");
        if health.up {
            tracing::warn!(
                cache_url = %self.settings.url(), error = %self.clean(error),
                "shared cache unavailable: using the in-memory cache alone until it answers again"
            );
        }
        health.up = false;
        health.retry_at = Some(self.clock.now() + RETRY_AFTER);
        if let Some(observer) = &self.observer {
            observer.shared_cache_up(false);
        }
    }

    /// Counts a lookup's `result`, and gives back `answer`.
    fn counted(&self, result: &'static str, answer: Shared) -> Shared {
        if let Some(observer) = &self.observer {
            observer.shared_cache_lookup(result);
        }
        answer
    }

    /// `text` without the password, should an error ever repeat it.
    fn clean(&self, text: &str) -> String {
        match &self.settings.password {
            Some(password) if !password.is_empty() => text.replace(password.as_str(), "***"),
            _ => text.to_owned(),
        }
    }
}

/// What the first request to the shared cache read.
enum Lookup {
    Nothing,
    Pinned {
        failure: Option<Vec<u8>>,
        answer: Option<Vec<u8>>,
    },
    Tagged {
        failure: Option<Vec<u8>>,
        digest: Option<String>,
        /// What is left of the tag's TTL, in ms (≤ 0: none, or no expiry).
        fresh_ms: i64,
    },
}

/// How a request to the shared cache went.
enum Outcome<T> {
    Done(T),
    /// Not sent: the shared cache failed less than [`RETRY_AFTER`] ago.
    Skipped,
    /// Failed, or no answer in time.
    Failed,
}

/// A TTL as Redis' PX (milliseconds, at least 1).
fn px(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let settings =
            SharedCacheSettings::new("redis://user:s3cr%40t@cache.example:6380/2", None, None)
                .unwrap();
        assert_eq!(settings.password.as_deref(), Some("s3cr@t"));
        assert_eq!(settings.url(), "redis://user@cache.example:6380/2");
        assert!(!format!("{settings:?}").contains("s3cr"), "{settings:?}");
        let configured =
            SharedCacheSettings::new("rediss://cache.example", Some("pw".into()), None).unwrap();
        assert_eq!(configured.password.as_deref(), Some("pw"));
        assert!(
            !format!("{configured:?}").contains("pw\""),
            "{configured:?}"
        );
        for bad in [
            "http://cache.example:6379",
            "redis://:s3cr3t@cache.example:6379/db",
            "redis:///0",
            "redis://cache.example/0#insecure",
            "s3cr3t@not a url",
        ] {
            let err = SharedCacheSettings::new(bad, None, None).unwrap_err();
            assert!(!err.contains("s3cr3t"), "{err}");
        }
        let twice = SharedCacheSettings::new("redis://:a@h", Some("b".into()), None).unwrap_err();
        assert!(twice.contains("give it once"), "{twice}");
        assert_eq!(redacted("redis://:s3cr3t@h:1/0"), "redis://:***@h:1/0");
    }

    #[test]
    fn keys_carry_an_identity_never_the_credential() {
        let settings =
            SharedCacheSettings::new("redis://127.0.0.1:1", Some("pw".into()), None).unwrap();
        let clock: Arc<dyn Clock> = Arc::new(super::super::clock::SystemClock);
        let shared = SharedCache::new(settings.clone(), clock.clone()).unwrap();
        let credential = Credential::new("robot", "hunter2-token", "secret apps/pull");
        let reference = ImageReference::parse("registry.example/app:1").unwrap();
        let keys = shared.keys(&reference, std::slice::from_ref(&credential), &[7]);
        let tag = keys.tag.clone().unwrap();
        assert!(
            tag.starts_with("tolerable:v1:tag:registry.example/app:1#"),
            "{tag}"
        );
        for text in [&tag, &keys.failure, &keys.digest("sha256:abc")] {
            assert!(
                !text.contains("robot") && !text.contains("hunter2"),
                "{text}"
            );
            assert!(!text.contains("apps/pull"), "{text}");
        }
        // The same on another replica (another process-local fingerprint)...
        let other = SharedCache::new(settings, clock.clone()).unwrap();
        let again = other.keys(&reference, std::slice::from_ref(&credential), &[99]);
        assert_eq!(again.tag.unwrap(), tag);
        // ...another with another password, or another credential, differs; anonymous is bare.
        let salted = SharedCacheSettings::new("redis://127.0.0.1:1", None, None).unwrap();
        let unsalted = SharedCache::new(salted, clock).unwrap();
        let elsewhere = unsalted.keys(&reference, std::slice::from_ref(&credential), &[7]);
        assert_ne!(elsewhere.tag.unwrap(), tag);
        let anonymous = shared.keys(&reference, &[], &[]);
        assert_eq!(
            anonymous.tag.unwrap(),
            "tolerable:v1:tag:registry.example/app:1#"
        );
        let pinned =
            ImageReference::parse(&format!("registry.example/app@sha256:{}", "a".repeat(64)))
                .unwrap();
        let keys = shared.keys(&pinned, &[], &[]);
        assert!(keys.tag.is_none());
        assert_eq!(
            keys.pinned.unwrap(),
            format!(
                "tolerable:v1:digest:registry.example/app@sha256:{}#",
                "a".repeat(64)
            )
        );
    }
}
