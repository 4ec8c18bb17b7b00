//! The lookup cache: answers by digest are kept long (a digest never changes what it names),
//! answers by tag for a TTL, failures only briefly. Concurrent lookups of one key share one
//! registry round trip. Bounded in entries.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;
use moka::Expiry;

use super::{ImagePlatforms, ImageReference, LookupError};

#[derive(Clone, Debug)]
pub struct CacheSettings {
    /// How long a tag's answer is trusted (tags move).
    pub tag_ttl: Duration,
    /// How long a digest's answer is kept (immutable; bounded only to free memory).
    pub digest_ttl: Duration,
    /// How long a failure is remembered, so an outage is not hammered; never forever.
    pub failure_ttl: Duration,
    pub max_entries: u64,
}

/// The answer depends on the reference and on who asks. Compact: there may be tens of
/// thousands of these.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The normalised reference (`registry/repository:tag@digest`).
    reference: Box<str>,
    /// Pinned by digest: the answer never changes.
    immutable: bool,
    /// Fingerprints of the credentials tried, in order.
    credentials: Box<[u64]>,
}

impl CacheKey {
    pub fn new(reference: &ImageReference, credentials: Vec<u64>) -> Self {
        Self {
            reference: reference.to_string().into_boxed_str(),
            immutable: reference.is_immutable(),
            credentials: credentials.into_boxed_slice(),
        }
    }
}

type Entry = Arc<Result<Arc<ImagePlatforms>, LookupError>>;

struct LookupExpiry {
    tag_ttl: Duration,
    digest_ttl: Duration,
    failure_ttl: Duration,
}

impl Expiry<CacheKey, Entry> for LookupExpiry {
    fn expire_after_create(&self, key: &CacheKey, value: &Entry, _: Instant) -> Option<Duration> {
        Some(match value.as_ref() {
            Err(_) => self.failure_ttl,
            Ok(_) if key.immutable => self.digest_ttl,
            Ok(_) => self.tag_ttl,
        })
    }
}

pub struct LookupCache {
    entries: Cache<CacheKey, Entry>,
}

impl LookupCache {
    pub fn new(settings: &CacheSettings) -> Self {
        let entries = Cache::builder()
            .max_capacity(settings.max_entries)
            .expire_after(LookupExpiry {
                tag_ttl: settings.tag_ttl,
                digest_ttl: settings.digest_ttl,
                failure_ttl: settings.failure_ttl,
            })
            .build();
        Self { entries }
    }

    /// The cached answer for `key`, or the result of `resolve`, which runs at most once at a
    /// time per key however many callers wait for it.
    pub async fn get_or_resolve(
        &self,
        key: CacheKey,
        resolve: impl Future<Output = Result<Arc<ImagePlatforms>, LookupError>>,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let entry = self
            .entries
            .get_with(key, async move { Arc::new(resolve.await) })
            .await;
        entry.as_ref().clone()
    }

    /// Entries cached now (after applying pending inserts and evictions, which moka defers).
    pub async fn entry_count(&self) -> u64 {
        self.entries.run_pending_tasks().await;
        self.entries.entry_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn settings(failure_ttl: Duration) -> CacheSettings {
        CacheSettings {
            tag_ttl: Duration::from_secs(60),
            digest_ttl: Duration::from_secs(3600),
            failure_ttl,
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
            platforms: vec![],
            served_by: "h".into(),
            credential_source: "anonymous".into(),
        })
    }

    #[tokio::test]
    async fn coalesces_and_remembers_success() {
        let cache = LookupCache::new(&settings(Duration::from_secs(1)));
        let calls = AtomicUsize::new(0);
        let lookups = (0..20).map(|_| {
            cache.get_or_resolve(key("app:1"), async {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(answer())
            })
        });
        let results = futures_util::future::join_all(lookups).await;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        cache
            .get_or_resolve(key("app:1"), async { panic!("must be cached") })
            .await
            .unwrap();
        // Another credential is another key.
        let other = CacheKey::new(&ImageReference::parse("app:1").unwrap(), vec![7]);
        cache
            .get_or_resolve(other, async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(answer())
            })
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn failures_expire() {
        let cache = LookupCache::new(&settings(Duration::from_millis(200)));
        let fail = || async {
            Err(LookupError::NotFound {
                reference: "x".into(),
            })
        };
        assert!(cache.get_or_resolve(key("app:2"), fail()).await.is_err());
        // Remembered for a moment: an outage is not hammered...
        assert!(cache
            .get_or_resolve(key("app:2"), async { Ok(answer()) })
            .await
            .is_err());
        // ...but not forever.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(cache
            .get_or_resolve(key("app:2"), async { Ok(answer()) })
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn tags_expire_digests_stay() {
        let mut s = settings(Duration::from_secs(1));
        s.tag_ttl = Duration::from_millis(100);
        let cache = LookupCache::new(&s);
        let pinned = format!("app@sha256:{}", "a".repeat(64));
        for image in ["app:3", pinned.as_str()] {
            cache
                .get_or_resolve(key(image), async { Ok(answer()) })
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let calls = AtomicUsize::new(0);
        for image in ["app:3", pinned.as_str()] {
            cache
                .get_or_resolve(key(image), async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok(answer())
                })
                .await
                .unwrap();
        }
        // Only the tag was asked again.
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn bounded() {
        let mut s = settings(Duration::from_secs(1));
        s.max_entries = 10;
        let cache = LookupCache::new(&s);
        for i in 0..100 {
            cache
                .get_or_resolve(key(&format!("app:{i}")), async { Ok(answer()) })
                .await
                .unwrap();
        }
        let count = cache.entry_count().await;
        assert!(count <= 10, "{count}");
    }
}
