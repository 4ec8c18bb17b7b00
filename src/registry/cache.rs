//! The lookup cache: answers by digest are kept long (a digest never changes what it names),
//! answers by tag for a TTL, failures only briefly. Concurrent lookups of one key share one
//! registry round trip. Bounded in entries.
//!
//! Revalidation: a tag's answer that is no longer fresh is handed to the lookup that refreshes
//! it (which asks the registry for the tag's digest with a HEAD, and keeps the answer when the
//! digest is the same), so it is kept as long as an answer by digest would be. Answers by tag
//! are also kept under their digest ([`LookupCache::remember`]), so a tag moving to a digest
//! already known needs no manifest GET.
//!
//! Stale-if-error (RFC 5861's idea, for registries): a tag's answer may stand in for `stale_ttl`
//! after it stops being fresh. When refreshing it fails because the registry is unavailable
//! (down, hung, 5xx, rate limited), that last known answer is served instead, marked stale, and
//! the refresh is retried after `failure_ttl`. An authoritative "no" (not found, unauthorized)
//! is never papered over.
//!
//! Bounded in bytes as well as entries: an entry weighs one unit per started KiB, and
//! `max_entries` counts units. Failures live in a space of their own, a tenth of the size, so a
//! flood of failing references (one Pod naming thousands of made-up images) evicts other
//! failures, never the answers other Pods' images depend on. A lookup cut short by tolerable's
//! own limits ([`LookupError::Throttled`]) is not cached at all.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;
use moka::ops::compute::{CompResult, Op};
use moka::Expiry;

use super::clock::Clock;
use super::{ImagePlatforms, ImageReference, LookupError};

#[derive(Clone, Debug)]
pub struct CacheSettings {
    /// How long a tag's answer is trusted (tags move).
    pub tag_ttl: Duration,
    /// How long a digest's answer is kept (immutable; bounded only to free memory).
    pub digest_ttl: Duration,
    /// How long a failure is remembered, so an outage is not hammered; never forever.
    pub failure_ttl: Duration,
    /// How long after a tag's answer stops being fresh it may still be served while its
    /// registry is unavailable. Zero turns stale-if-error off.
    pub stale_ttl: Duration,
    pub max_entries: u64,
}

/// The answer depends on the reference and on who asks. Compact: there may be tens of
/// thousands of these.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    /// The normalised reference (`registry/repository:tag@digest`).
    reference: Box<str>,
    /// Pinned by digest: the answer never changes.
    immutable: bool,
    /// Fingerprints of the credentials tried, in order.
    credentials: Box<[u64]>,
}

impl CacheKey {
    pub(crate) fn new(reference: &ImageReference, credentials: Vec<u64>) -> Self {
        Self {
            reference: reference.to_string().into_boxed_str(),
            immutable: reference.is_immutable(),
            credentials: credentials.into_boxed_slice(),
        }
    }

    /// The fingerprints of the credentials tried, in order.
    pub(crate) fn credentials(&self) -> &[u64] {
        &self.credentials
    }
}

/// What a lookup learned: an answer, fresh for the tag TTL unless `fresh_for` says less (an
/// answer another replica learned earlier, through the shared cache).
#[derive(Debug, Clone)]
pub(crate) struct Learned {
    pub(crate) found: Arc<ImagePlatforms>,
    pub(crate) fresh_for: Option<Duration>,
}

impl From<Arc<ImagePlatforms>> for Learned {
    fn from(found: Arc<ImagePlatforms>) -> Self {
        Self {
            found,
            fresh_for: None,
        }
    }
}

/// One cached answer and its horizons.
#[derive(Debug)]
struct Slot {
    result: Result<Arc<ImagePlatforms>, LookupError>,
    /// Until then the answer is served without asking the registry.
    fresh_until: Instant,
    /// Until then it may stand in while the registry is unavailable (stale-if-error).
    stale_until: Instant,
    /// Until then it is kept (to revalidate, or as a stale fallback); then evicted.
    keep_until: Instant,
    /// When the registry last really gave this answer (for the staleness warning).
    answered_at: Instant,
}

type Entry = Arc<Slot>;

/// Tells moka when to drop a slot: at its `keep_until`. moka counts the time down on its own
/// clock, which cannot be injected; the remaining lifetime it is given is measured on
/// tolerable's, so every decision about an answer (fresh, stale, expired) reads the injected
/// clock and moka's only frees the memory afterwards.
struct SlotExpiry {
    clock: Arc<dyn Clock>,
}

impl Expiry<CacheKey, Entry> for SlotExpiry {
    fn expire_after_create(&self, _: &CacheKey, slot: &Entry, _: Instant) -> Option<Duration> {
        Some(slot.keep_until.saturating_duration_since(self.clock.now()))
    }

    fn expire_after_update(
        &self,
        key: &CacheKey,
        slot: &Entry,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, slot, now)
    }
}

pub(crate) struct LookupCache {
    /// Answers (fresh, or kept as a stale fallback).
    entries: Cache<CacheKey, Entry>,
    /// Failures, remembered for `failure_ttl`.
    failures: Cache<CacheKey, Entry>,
    settings: CacheSettings,
    clock: Arc<dyn Clock>,
}

/// An entry's weight: one unit per started KiB of what it holds.
fn weight(key: &CacheKey, slot: &Entry) -> u32 {
    let held = match &slot.result {
        Ok(found) => {
            let fact = &found.fact;
            found.digest.len()
                + fact.platforms.len() * std::mem::size_of::<super::Platform>()
                + fact.artifact.as_ref().map_or(0, String::len)
                + fact.stale.as_ref().map_or(0, |s| s.cause.len())
                + found.served_by.len()
        }
        Err(e) => e.to_string().len(),
    };
    let bytes = key.reference.len() + key.credentials.len() * 8 + held + 128;
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

impl LookupCache {
    /// A cache whose answers age by `clock`.
    pub(crate) fn with_clock(settings: &CacheSettings, clock: Arc<dyn Clock>) -> Self {
        let entries = Cache::builder()
            .max_capacity(settings.max_entries)
            .weigher(weight)
            .expire_after(SlotExpiry {
                clock: clock.clone(),
            })
            .build();
        let failures = Cache::builder()
            .max_capacity((settings.max_entries / 10).max(16))
            .weigher(weight)
            .expire_after(SlotExpiry {
                clock: clock.clone(),
            })
            .build();
        Self {
            entries,
            failures,
            settings: settings.clone(),
            clock,
        }
    }

    /// The cached answer for `key` while it is fresh (served without asking the registry).
    pub(crate) async fn fresh(
        &self,
        key: &CacheKey,
    ) -> Option<Result<Arc<ImagePlatforms>, LookupError>> {
        if let Some(slot) = self.entries.get(key).await {
            if self.clock.now() < slot.fresh_until {
                return Some(slot.result.clone());
            }
        }
        let failed = self.failures.get(key).await?;
        (self.clock.now() < failed.fresh_until).then(|| failed.result.clone())
    }

    /// The answer kept for `key`, fresh or not (an answer by digest is the same until evicted).
    pub(crate) async fn known(&self, key: &CacheKey) -> Option<Arc<ImagePlatforms>> {
        let slot = self.entries.get(key).await?;
        slot.result
            .as_ref()
            .ok()
            .filter(|found| found.fact.stale.is_none())
            .cloned()
    }

    /// Keeps `found` under `key` as an answer by digest (a tag's answer, under its digest).
    pub(crate) async fn remember(&self, key: CacheKey, found: Arc<ImagePlatforms>) {
        let slot = self.next_slot(true, None, Ok(found.into()));
        self.entries.insert(key, Arc::new(slot)).await;
    }

    /// The cached answer for `key`, or the result of `resolve`, which runs at most once at a
    /// time per key however many callers wait for it, and is given the last answer kept (to
    /// revalidate). When `resolve` fails because the registry is unavailable and an earlier
    /// answer may still stand in, that answer is returned, marked stale. It takes the key's
    /// turn even for a fresh answer: callers on a hot path ask [`Self::fresh`] first (the
    /// resolver does), so only misses come here.
    pub(crate) async fn get_or_resolve<F>(
        &self,
        key: CacheKey,
        resolve: impl FnOnce(Option<Arc<ImagePlatforms>>) -> F,
    ) -> Result<Arc<ImagePlatforms>, LookupError>
    where
        F: Future<Output = Result<Learned, LookupError>>,
    {
        let immutable = key.immutable;
        // What this call answers when the entry itself is not it (a failure, kept apart).
        let answered = std::sync::Mutex::new(None);
        let failures = &self.failures;
        let failure_key = key.clone();
        let computed = self
            .entries
            .entry(key)
            .and_compute_with(|current| async {
                let current = current.map(moka::Entry::into_value);
                // Still fresh, or refreshed by another caller while this one waited its turn.
                if current
                    .as_ref()
                    .is_some_and(|s| self.clock.now() < s.fresh_until)
                {
                    return Op::Nop;
                }
                if let Some(failed) = failures.get(&failure_key).await {
                    if self.clock.now() < failed.fresh_until {
                        *answered.lock().expect("not poisoned") = Some(failed.result.clone());
                        return Op::Nop;
                    }
                }
                let last = current
                    .as_ref()
                    .and_then(|s| s.result.as_ref().ok().cloned());
                let result = resolve(last).await;
                // tolerable's own bounds on all lookups, not an answer: nothing to keep.
                if let Err(e @ (LookupError::Throttled { .. } | LookupError::Busy { .. })) = &result
                {
                    *answered.lock().expect("not poisoned") = Some(Err(e.clone()));
                    return Op::Nop;
                }
                let slot = self.next_slot(immutable, current.as_deref(), result);
                if slot.result.is_ok() {
                    return Op::Put(Arc::new(slot));
                }
                let authoritative = slot.result.as_ref().is_err_and(|e| !e.is_unavailable());
                *answered.lock().expect("not poisoned") = Some(slot.result.clone());
                failures.insert(failure_key, Arc::new(slot)).await;
                // A "no" from the registry ends the last known answer; an outage keeps it for
                // a later stale answer.
                if authoritative && current.is_some() {
                    Op::Remove
                } else {
                    Op::Nop
                }
            })
            .await;
        if let Some(result) = answered.into_inner().expect("not poisoned") {
            return result;
        }
        match computed {
            CompResult::Inserted(entry)
            | CompResult::ReplacedWith(entry)
            | CompResult::Unchanged(entry) => entry.into_value().result.clone(),
            CompResult::StillNone(_) | CompResult::Removed(_) => {
                unreachable!("without an answer of its own the closure keeps or puts a value")
            }
        }
    }

    /// What to keep after a lookup that gave `result`, `previous` being what was kept before.
    /// A tag's answer is kept as long as a digest's (at least to the end of its stale window),
    /// so that however rarely it is asked for, a HEAD can revalidate it.
    fn next_slot(
        &self,
        immutable: bool,
        previous: Option<&Slot>,
        result: Result<Learned, LookupError>,
    ) -> Slot {
        let now = self.clock.now();
        let s = &self.settings;
        match result {
            Ok(learned) => {
                let ttl = if immutable { s.digest_ttl } else { s.tag_ttl };
                let fresh_until = now + learned.fresh_for.map_or(ttl, |d| d.min(ttl));
                let stale_until = fresh_until
                    + if immutable {
                        Duration::ZERO
                    } else {
                        s.stale_ttl
                    };
                Slot {
                    result: Ok(learned.found),
                    fresh_until,
                    stale_until,
                    keep_until: stale_until.max(now + s.digest_ttl),
                    answered_at: now,
                }
            }
            Err(error) => {
                let last_known = previous
                    .filter(|_| error.is_unavailable())
                    .and_then(|p| Some((p, p.result.as_ref().ok()?)));
                match last_known {
                    Some((previous, found)) if now < previous.stale_until => Slot {
                        result: Ok(Arc::new(found.as_stale(
                            &error,
                            now.saturating_duration_since(previous.answered_at),
                        ))),
                        fresh_until: now + s.failure_ttl,
                        stale_until: previous.stale_until,
                        keep_until: previous.keep_until,
                        answered_at: previous.answered_at,
                    },
                    _ => Slot {
                        result: Err(error),
                        fresh_until: now + s.failure_ttl,
                        stale_until: now,
                        keep_until: now + s.failure_ttl,
                        answered_at: now,
                    },
                }
            }
        }
    }

    /// Entries cached now (after applying pending inserts and evictions, which moka defers).
    pub(crate) async fn entry_count(&self) -> u64 {
        self.entries.run_pending_tasks().await;
        self.failures.run_pending_tasks().await;
        self.entries.entry_count() + self.failures.entry_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::clock::{ManualClock, SystemClock};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn cache_on_system_clock(settings: &CacheSettings) -> LookupCache {
        LookupCache::with_clock(settings, Arc::new(SystemClock))
    }

    /// A cache on a clock that moves only when the test says.
    fn cache_on_clock(settings: &CacheSettings) -> (LookupCache, Arc<ManualClock>) {
        let clock = ManualClock::new();
        (LookupCache::with_clock(settings, clock.clone()), clock)
    }

    fn settings(failure_ttl: Duration) -> CacheSettings {
        CacheSettings {
            tag_ttl: Duration::from_secs(60),
            digest_ttl: Duration::from_secs(3600),
            failure_ttl,
            stale_ttl: Duration::from_secs(600),
            max_entries: 100,
        }
    }

    fn key(image: &str) -> CacheKey {
        CacheKey::new(&ImageReference::parse(image).unwrap(), vec![])
    }

    fn answer() -> Arc<ImagePlatforms> {
        Arc::new(ImagePlatforms {
            digest: "d".into(),
            media_type: "m",
            served_by: "h".into(),
            fact: Arc::new(crate::registry::ImageFact {
                platforms: vec![],
                artifact: None,
                credentials: crate::registry::Provenance::Anonymous,
                stale: None,
                digest: None,
            }),
        })
    }

    #[tokio::test]
    async fn coalesces_and_remembers_success() {
        let cache = cache_on_system_clock(&settings(Duration::from_secs(1)));
        let calls = AtomicUsize::new(0);
        let lookups = (0..20).map(|_| {
            cache.get_or_resolve(key("app:1"), |_| async {
                calls.fetch_add(1, Ordering::SeqCst);
                // Still in flight when the other callers arrive.
                tokio::task::yield_now().await;
                Ok(answer().into())
            })
        });
        let results = futures_util::future::join_all(lookups).await;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        cache
            .get_or_resolve(key("app:1"), |_| async { panic!("must be cached") })
            .await
            .unwrap();
        // Another credential is another key.
        let other = CacheKey::new(&ImageReference::parse("app:1").unwrap(), vec![7]);
        cache
            .get_or_resolve(other, |_| async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(answer().into())
            })
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn failures_expire() {
        let (cache, clock) = cache_on_clock(&settings(Duration::from_millis(200)));
        let fail = || async {
            Err(LookupError::NotFound {
                reference: "x".into(),
            })
        };
        assert!(cache
            .get_or_resolve(key("app:2"), |_| fail())
            .await
            .is_err());
        // Remembered for a moment: an outage is not hammered...
        assert!(cache
            .get_or_resolve(key("app:2"), |_| async { Ok(answer().into()) })
            .await
            .is_err());
        // ...but not forever.
        clock.advance(Duration::from_millis(400));
        assert!(cache
            .get_or_resolve(key("app:2"), |_| async { Ok(answer().into()) })
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn tags_expire_digests_stay() {
        let mut s = settings(Duration::from_secs(1));
        s.tag_ttl = Duration::from_millis(100);
        let (cache, clock) = cache_on_clock(&s);
        let pinned = format!("app@sha256:{}", "a".repeat(64));
        for image in ["app:3", pinned.as_str()] {
            cache
                .get_or_resolve(key(image), |_| async { Ok(answer().into()) })
                .await
                .unwrap();
        }
        clock.advance(Duration::from_millis(300));
        let calls = AtomicUsize::new(0);
        for image in ["app:3", pinned.as_str()] {
            cache
                .get_or_resolve(key(image), |_| async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok(answer().into())
                })
                .await
                .unwrap();
        }
        // Only the tag was asked again.
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_is_fresh_until_its_ttl_and_not_a_moment_longer() {
        let mut s = settings(Duration::from_millis(100));
        s.tag_ttl = Duration::from_secs(60);
        let (cache, clock) = cache_on_clock(&s);
        cache
            .get_or_resolve(key("app:7"), |_| async { Ok(answer().into()) })
            .await
            .unwrap();
        clock.advance(Duration::from_secs(60) - Duration::from_nanos(1));
        assert!(cache.fresh(&key("app:7")).await.is_some());
        clock.advance(Duration::from_nanos(1));
        assert!(cache.fresh(&key("app:7")).await.is_none());
        // A failure likewise, for its own, shorter time.
        let missing = || async {
            Err(LookupError::NotFound {
                reference: "app:8".into(),
            })
        };
        let _ = cache.get_or_resolve(key("app:8"), |_| missing()).await;
        clock.advance(Duration::from_millis(99));
        assert!(cache.fresh(&key("app:8")).await.is_some_and(|r| r.is_err()));
        clock.advance(Duration::from_millis(1));
        assert!(cache.fresh(&key("app:8")).await.is_none());
    }

    #[tokio::test]
    async fn a_tag_no_longer_fresh_is_handed_its_last_answer_even_without_stale_if_error() {
        let mut s = settings(Duration::from_millis(100));
        s.tag_ttl = Duration::from_secs(60);
        s.stale_ttl = Duration::ZERO;
        let (cache, clock) = cache_on_clock(&s);
        let first = cache.get_or_resolve(key("app:9"), |last| async move {
            assert!(last.is_none());
            Ok(answer().into())
        });
        first.await.unwrap();
        // An hour later the tag's answer is still there to revalidate...
        clock.advance(Duration::from_secs(3600));
        let revalidated = cache.get_or_resolve(key("app:9"), |last| async move {
            assert_eq!(last.expect("the last answer").digest, "d");
            Ok(answer().into())
        });
        assert!(revalidated.await.unwrap().fact.stale.is_none());
        // ...but with stale-if-error off, an outage is reported as it is.
        clock.advance(Duration::from_secs(61));
        let down = cache.get_or_resolve(key("app:9"), |last| async move {
            assert!(last.is_some());
            Err(unavailable())
        });
        assert!(matches!(down.await, Err(LookupError::Unreachable { .. })));
        // The answer outlives the outage, for the next revalidation.
        clock.advance(Duration::from_secs(1));
        let again = cache.get_or_resolve(key("app:9"), |last| async move {
            assert!(last.is_some());
            Ok(answer().into())
        });
        again.await.unwrap();
    }

    #[tokio::test]
    async fn answers_by_digest_are_remembered_and_a_shared_answer_is_fresh_as_long_as_it_said() {
        let (cache, clock) = cache_on_clock(&settings(Duration::from_secs(1)));
        let pinned = key(&format!("app@sha256:{}", "b".repeat(64)));
        assert!(cache.known(&pinned).await.is_none());
        cache.remember(pinned.clone(), answer()).await;
        assert_eq!(cache.known(&pinned).await.unwrap().digest, "d");
        assert!(
            cache.fresh(&pinned).await.is_some(),
            "a digest's answer is fresh"
        );
        let other = key(&format!("app@sha256:{}", "c".repeat(64)));
        assert!(cache.known(&other).await.is_none());

        let learned = Learned {
            found: answer(),
            fresh_for: Some(Duration::from_secs(10)),
        };
        cache
            .get_or_resolve(key("app:10"), |_| async { Ok(learned) })
            .await
            .unwrap();
        clock.advance(Duration::from_secs(10) - Duration::from_nanos(1));
        assert!(cache.fresh(&key("app:10")).await.is_some());
        clock.advance(Duration::from_nanos(1));
        assert!(cache.fresh(&key("app:10")).await.is_none());
    }

    #[tokio::test]
    async fn bounded() {
        let mut s = settings(Duration::from_secs(1));
        s.max_entries = 10;
        let cache = cache_on_system_clock(&s);
        for i in 0..100 {
            cache
                .get_or_resolve(key(&format!("app:{i}")), |_| async { Ok(answer().into()) })
                .await
                .unwrap();
        }
        let count = cache.entry_count().await;
        assert!(count <= 10, "{count}");
    }

    fn unavailable() -> LookupError {
        LookupError::Unreachable {
            reference: "app".into(),
            registry: "r".into(),
            reason: "connection refused".into(),
            cause: String::new(),
        }
    }

    #[tokio::test]
    async fn stale_if_error_serves_the_last_known_answer_while_the_registry_is_down() {
        let mut s = settings(Duration::from_millis(200));
        s.tag_ttl = Duration::from_millis(100);
        s.stale_ttl = Duration::from_secs(60);
        let (cache, clock) = cache_on_clock(&s);
        cache
            .get_or_resolve(key("app:4"), |_| async { Ok(answer().into()) })
            .await
            .unwrap();
        clock.advance(Duration::from_millis(150));
        // The tag is due for a refresh; the registry is down: the last answer stands, marked.
        let calls = AtomicUsize::new(0);
        let down = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(unavailable())
        };
        let stale = cache
            .get_or_resolve(key("app:4"), |_| down())
            .await
            .unwrap();
        let why = stale.fact.stale.as_ref().expect("marked stale").to_string();
        assert!(why.contains("connection refused"), "{why}");
        assert_eq!(stale.digest, "d");
        // Its age is counted from when the registry last gave it.
        assert_eq!(
            stale.fact.stale.as_ref().unwrap().age,
            Duration::from_millis(150)
        );
        // The failed refresh is remembered briefly: the next lookups do not ask again...
        cache
            .get_or_resolve(key("app:4"), |_| down())
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // ...then ask again, and a recovered registry gives a fresh answer.
        clock.advance(Duration::from_millis(250));
        let older = cache
            .get_or_resolve(key("app:4"), |_| down())
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(
            older.fact.stale.as_ref().unwrap().age,
            Duration::from_millis(400)
        );
        clock.advance(Duration::from_millis(250));
        let fresh = cache
            .get_or_resolve(key("app:4"), |_| async { Ok(answer().into()) })
            .await
            .unwrap();
        assert!(fresh.fact.stale.is_none());
    }

    #[tokio::test]
    async fn stale_if_error_never_hides_an_authoritative_answer_nor_outlives_its_window() {
        let mut s = settings(Duration::from_millis(50));
        s.tag_ttl = Duration::from_millis(50);
        s.stale_ttl = Duration::from_millis(200);
        let (cache, clock) = cache_on_clock(&s);
        for image in ["app:5", "app:6"] {
            cache
                .get_or_resolve(key(image), |_| async { Ok(answer().into()) })
                .await
                .unwrap();
        }
        clock.advance(Duration::from_millis(80));
        // The tag was deleted: "not found" is the registry's answer, not an outage.
        let gone = cache
            .get_or_resolve(key("app:5"), |_| async {
                Err(LookupError::NotFound {
                    reference: "app:5".into(),
                })
            })
            .await;
        assert!(matches!(gone, Err(LookupError::NotFound { .. })));
        // Past the stale window the outage is reported as it is.
        clock.advance(Duration::from_millis(300));
        let down = cache
            .get_or_resolve(key("app:6"), |_| async { Err(unavailable()) })
            .await;
        assert!(matches!(down, Err(LookupError::Unreachable { .. })));
    }

    #[tokio::test]
    async fn a_flood_of_failures_never_pushes_out_answers() {
        let mut s = settings(Duration::from_secs(60));
        s.max_entries = 100;
        let cache = cache_on_system_clock(&s);
        for i in 0..20 {
            cache
                .get_or_resolve(key(&format!("hot:{i}")), |_| async { Ok(answer().into()) })
                .await
                .unwrap();
        }
        for i in 0..2000 {
            let failed = cache
                .get_or_resolve(key(&format!("junk{i}:1")), |_| async {
                    Err(LookupError::NotFound {
                        reference: "junk".into(),
                    })
                })
                .await;
            assert!(failed.is_err());
        }
        cache.entries.run_pending_tasks().await;
        cache.failures.run_pending_tasks().await;
        for i in 0..20 {
            assert!(
                cache.fresh(&key(&format!("hot:{i}"))).await.is_some(),
                "hot:{i} was evicted by failures"
            );
        }
        assert!(cache.failures.weighted_size() <= 16.max(s.max_entries / 10));
    }

    #[tokio::test]
    async fn big_answers_weigh_more_and_throttled_lookups_are_not_kept() {
        let mut s = settings(Duration::from_secs(60));
        s.max_entries = 50;
        let cache = cache_on_system_clock(&s);
        let big = Arc::new(ImagePlatforms {
            fact: Arc::new(crate::registry::ImageFact {
                platforms: (0..64)
                    .map(|i| crate::registry::Platform::normalized("linux", &format!("a{i}"), None))
                    .collect(),
                stale: Some(crate::registry::Staleness {
                    cause: "x".repeat(4000),
                    age: Duration::from_secs(1),
                }),
                ..(*answer().fact).clone()
            }),
            ..(*answer()).clone()
        });
        for i in 0..50 {
            let big = big.clone();
            cache
                .get_or_resolve(key(&format!("big:{i}")), |_| async move { Ok(big.into()) })
                .await
                .unwrap();
        }
        cache.entries.run_pending_tasks().await;
        assert!(cache.entries.weighted_size() <= 50);
        assert!(
            cache.entries.entry_count() < 20,
            "{}",
            cache.entries.entry_count()
        );

        let calls = AtomicUsize::new(0);
        for _ in 0..2 {
            let throttled = cache
                .get_or_resolve(key("busy:1"), |_| async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err(LookupError::Throttled {
                        reference: "busy:1".into(),
                        after: Duration::from_secs(1),
                    })
                })
                .await;
            assert!(matches!(throttled, Err(LookupError::Throttled { .. })));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "asked again each time");
    }
}
