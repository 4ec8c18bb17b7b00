//! Manifests named by digest and config blobs, read once across lookups: N Pods (or one Pod's
//! N images) whose trees share children cost their registry one GET per child, not N (issue
//! 34: a 100-image Pod over one nested index cost 5,695 GETs).
//!
//! Keyed by registry host, repository, credential (its fingerprint: another credential may not
//! read what this one can) and digest — content the client has checked against its digest, so
//! what is kept is what any lookup would have read. Concurrent reads of one key are coalesced:
//! one request, the others wait for it (within their own deadlines; one whose reader was cut
//! off reads it itself). A failure is not kept, and a lookup that waited on another's failed
//! read reads the child itself, so it fails only of its own bounds and its own answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::FetchError;

/// Bytes of children kept: thousands of ordinary manifests and configs (a few KiB each).
const CHILDREN_BYTES: u64 = 4 << 20;
/// How long a child is kept: long enough for a burst of Pods (a rollout, a Job's fan-out); the
/// lookup cache keeps the answers themselves.
const CHILDREN_TTL: Duration = Duration::from_secs(300);

/// A child's read: boxed, so the (deep) HTTP future's type does not nest into every caller's.
pub(crate) type Read<'a> = Pin<Box<dyn Future<Output = Result<Bytes, FetchError>> + Send + 'a>>;

/// What one child is.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct ChildKey {
    pub(crate) host: String,
    pub(crate) repository: String,
    pub(crate) credential: Option<u64>,
    pub(crate) digest: String,
    /// A config blob, not a manifest.
    pub(crate) blob: bool,
}

/// The children read lately, and the reads under way.
#[derive(Clone)]
pub(crate) struct Children {
    cache: moka::future::Cache<ChildKey, Bytes>,
}

impl Default for Children {
    fn default() -> Self {
        Self {
            cache: moka::future::Cache::builder()
                .max_capacity(CHILDREN_BYTES)
                .weigher(|key: &ChildKey, body: &Bytes| {
                    let weight = key.repository.len() + key.digest.len() + body.len();
                    u32::try_from(weight).unwrap_or(u32::MAX)
                })
                .time_to_live(CHILDREN_TTL)
                .build(),
        }
    }
}

impl Children {
    /// The child `key`: kept, read by a lookup under way, or read now with `read`. Boxed:
    /// the cache's future would otherwise nest into every lookup's type.
    pub(crate) fn get_or_read<'a>(&'a self, key: ChildKey, mut read: Read<'a>) -> Read<'a> {
        Box::pin(async move {
            let mine = AtomicBool::new(false);
            let shared = self
                .cache
                .try_get_with_by_ref(&key, async {
                    mine.store(true, Ordering::Relaxed);
                    read.as_mut().await
                })
                .await;
            match shared {
                Ok(body) => Ok(body),
                Err(failed) if mine.load(Ordering::Relaxed) => Err(Arc::unwrap_or_clone(failed)),
                // Another lookup's read failed (its credential, its bounds, its deadline):
                // this one reads for itself.
                Err(_) => read.await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn key(digest: &str) -> ChildKey {
        ChildKey {
            host: "r.example".into(),
            repository: "app".into(),
            credential: None,
            digest: digest.into(),
            blob: false,
        }
    }

    #[tokio::test]
    async fn concurrent_reads_of_a_child_cost_one_read_and_failures_are_not_shared() {
        let children = Children::default();
        let reads = AtomicUsize::new(0);
        let read = |body: &'static str| {
            let reads = &reads;
            Box::pin(async move {
                reads.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
                Ok(Bytes::from_static(body.as_bytes()))
            }) as Read<'_>
        };
        let all = futures_util::future::join_all(
            (0..20).map(|_| children.get_or_read(key("sha256:a"), read("a"))),
        )
        .await;
        assert!(all.iter().all(|r| r.as_deref() == Ok(b"a".as_slice())));
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        let again = children.get_or_read(key("sha256:a"), read("b")).await;
        assert_eq!(again.as_deref(), Ok(b"a".as_slice()), "kept");
        assert_eq!(reads.load(Ordering::Relaxed), 1);

        // The second read waits on the first, which fails of its own bound.
        let failing = children.get_or_read(
            key("sha256:f"),
            Box::pin(async {
                tokio::task::yield_now().await;
                Err::<Bytes, _>(FetchError::OverLimit("its own bound".into()))
            }),
        );
        let waiting = children.get_or_read(key("sha256:f"), read("f"));
        let (failed, read_itself) = tokio::join!(failing, waiting);
        assert!(matches!(failed, Err(FetchError::OverLimit(_))));
        assert_eq!(read_itself.as_deref(), Ok(b"f".as_slice()));
    }
}
