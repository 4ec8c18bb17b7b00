//! Manifests named by digest and config blobs, read once across lookups: N Pods (or one Pod's
//! N images) whose trees share children cost their registry one GET per child, not N (issue
//! 34: a 100-image Pod over one nested index cost 5,695 GETs).
//!
//! Keyed by registry host, repository, credential (its fingerprint: another credential may not
//! read what this one can) and digest — content the client has checked against its digest, so
//! what is kept is what any lookup would have read. Concurrent reads of one key are coalesced:
//! one request, the others wait their turn (within their own deadlines, marked meanwhile as
//! reading that child, so one cut off while waiting on a stalled child ends as stalled). A
//! failure is not kept: the next waiter reads the child itself, so a lookup fails only of its
//! own bounds and its own answer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;

use super::bounds::LookupBounds;
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
pub(crate) struct Children {
    kept: moka::future::Cache<ChildKey, Bytes>,
    /// One turn per child being read: its reader holds it, the others wait on it.
    reading: Mutex<Reading>,
}

#[derive(Default)]
struct Reading {
    turns: HashMap<ChildKey, Weak<tokio::sync::Mutex<()>>>,
    /// Prune finished turns when the map reaches this size.
    prune_at: usize,
}

impl Default for Children {
    fn default() -> Self {
        Self {
            kept: moka::future::Cache::builder()
                .max_capacity(CHILDREN_BYTES)
                .weigher(|key: &ChildKey, body: &Bytes| {
                    let weight = key.repository.len() + key.digest.len() + body.len();
                    u32::try_from(weight).unwrap_or(u32::MAX)
                })
                .time_to_live(CHILDREN_TTL)
                .build(),
            reading: Mutex::default(),
        }
    }
}

impl Children {
    /// The child `key`: kept, read by another lookup meanwhile, or read now with `read`. While
    /// it waits on another lookup's read, `bounds` marks `what` being read. Boxed: the
    /// future would otherwise nest into every lookup's type.
    pub(crate) fn get_or_read<'a>(
        &'a self,
        key: ChildKey,
        read: Read<'a>,
        (bounds, what): (&'a LookupBounds, &'a str),
    ) -> Read<'a> {
        Box::pin(async move {
            if let Some(body) = self.kept.get(&key).await {
                return Ok(body);
            }
            let turn = self.turn(&key);
            let _turn = match turn.try_lock() {
                Ok(mine) => mine,
                Err(_) => {
                    let _waiting = bounds.reading_body(what);
                    let mine = turn.lock().await;
                    if let Some(body) = self.kept.get(&key).await {
                        return Ok(body);
                    }
                    // The lookup that read it failed, or was cut off: this one reads it.
                    mine
                }
            };
            let body = read.await?;
            self.kept.insert(key, body.clone()).await;
            Ok(body)
        })
    }

    /// The turn to read `key`, the same for every lookup reading it now.
    fn turn(&self, key: &ChildKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut reading = self.reading.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(turn) = reading.turns.get(key).and_then(Weak::upgrade) {
            return turn;
        }
        if reading.turns.len() >= reading.prune_at {
            reading.turns.retain(|_, turn| turn.strong_count() > 0);
            reading.prune_at = (2 * reading.turns.len()).max(64);
        }
        let turn = Arc::default();
        reading.turns.insert(key.clone(), Arc::downgrade(&turn));
        turn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::registry::bounds::RegistryBytes;

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
        let bounds = LookupBounds::new(Arc::new(RegistryBytes::new(1, None)), None);
        let marked = (&bounds, "sha256:a");
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
            (0..20).map(|_| children.get_or_read(key("sha256:a"), read("a"), marked)),
        )
        .await;
        assert!(all.iter().all(|r| r.as_deref() == Ok(b"a".as_slice())));
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        let again = children
            .get_or_read(key("sha256:a"), read("b"), marked)
            .await;
        assert_eq!(again.as_deref(), Ok(b"a".as_slice()), "kept");
        assert_eq!(reads.load(Ordering::Relaxed), 1);

        // The second read waits on the first, which fails of its own bound.
        let failing = children.get_or_read(
            key("sha256:f"),
            Box::pin(async {
                tokio::task::yield_now().await;
                Err::<Bytes, _>(FetchError::OverLimit("its own bound".into()))
            }),
            marked,
        );
        let waiting = children.get_or_read(key("sha256:f"), read("f"), marked);
        let (failed, read_itself) = tokio::join!(failing, waiting);
        assert!(matches!(failed, Err(FetchError::OverLimit(_))));
        assert_eq!(read_itself.as_deref(), Ok(b"f".as_slice()));
        assert_eq!(reads.load(Ordering::Relaxed), 2);

        // Waiting on a read that stalls: marked as reading that child meanwhile.
        let mut stalls =
            children.get_or_read(key("sha256:s"), Box::pin(std::future::pending()), marked);
        assert!(futures_util::poll!(stalls.as_mut()).is_pending());
        let mut waits = children.get_or_read(key("sha256:s"), read("s"), (&bounds, "sha256:s"));
        assert!(futures_util::poll!(waits.as_mut()).is_pending());
        assert_eq!(bounds.stalled_body().as_deref(), Some("sha256:s"));
        drop(stalls);
        assert_eq!(waits.await.as_deref(), Ok(b"s".as_slice()), "read itself");
        assert_eq!(bounds.stalled_body(), None);
    }
}
