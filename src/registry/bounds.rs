//! What one lookup may cost, whatever the registry serves: the bytes of registry answers it
//! holds while they arrive (its share of a process-wide budget), and the manifests and blobs its
//! walk fetches — counted over the whole tree, however its indexes nest, a few at a time.
//!
//! Each index is already bounded on its own (entries, depth), but a tree of indexes multiplies
//! those bounds, and a registry that sends 4 MiB − 2 bytes of each child and stalls would make
//! every child hold its buffer. These bounds hold per lookup: a lookup that reaches them ends
//! as the image's own failure ([`FetchError::OverLimit`]), never the registry's; one that finds
//! the process-wide budget spent ends at once as [`FetchError::Busy`].
//!
//! A lookup also knows what its requests are waiting for — the registry's answer (status and
//! headers), or the rest of a manifest or blob it has begun to send — so that a lookup cut off
//! by its deadline can be told apart: a registry that did not answer is the registry's failure
//! (its circuit breaker counts it), an image whose answer stalled after its headers is the
//! image's own ([`LookupBounds::stalled_body`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Semaphore, SemaphorePermit};

use super::client::MAX_MANIFEST_BYTES;
use super::{FetchError, RegistryObserver};

/// Bytes of registry answers (manifests, configs, token and error bodies) all lookups may hold
/// while they arrive: well inside the shipped Deployment's 128 MiB memory limit, with the
/// server's request-body budget beside it.
pub(crate) const REGISTRY_BYTES_BUDGET: usize = 32 << 20;
/// One lookup's share of [`REGISTRY_BYTES_BUDGET`]: one manifest of the largest size the OCI
/// distribution spec lets a registry serve, and a little room for its siblings. Real manifests
/// and configs are a few KiB.
pub(crate) const LOOKUP_BYTES_SHARE: usize = MAX_MANIFEST_BYTES + (1 << 20);
/// Manifests and blobs one lookup fetches at most, over the whole walk (mirror, origin and
/// every credential tried). A real image needs one (an index whose entries name their
/// platforms) to a few (a single manifest and its config); an index of 31 entries without
/// platforms still fits. A hostile tree of nested indexes would otherwise cost tens of
/// thousands of requests.
pub(crate) const MAX_FETCHES_PER_LOOKUP: usize = 64;
/// Manifests and blobs one lookup fetches at the same time, however many indexes it walks.
pub(crate) const FETCHES_AT_ONCE: usize = 4;

/// The process-wide budget of registry bytes in flight.
pub(crate) struct RegistryBytes {
    used: AtomicUsize,
    limit: usize,
    /// Told every change, so `tolerable_registry_bytes_in_flight` follows it.
    observer: Option<Arc<dyn RegistryObserver>>,
}

impl RegistryBytes {
    pub(crate) fn new(limit: usize, observer: Option<Arc<dyn RegistryObserver>>) -> Self {
        Self {
            used: AtomicUsize::new(0),
            limit,
            observer,
        }
    }

    /// Bytes held now.
    pub(crate) fn in_flight(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    fn try_take(&self, bytes: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok();
        if taken {
            self.tell(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        taken
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.tell(-i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The change, not the total: changes told out of order still add up to the total.
    fn tell(&self, change: i64) {
        if let Some(observer) = &self.observer {
            observer.registry_bytes(change);
        }
    }
}

/// One lookup's bounds: its share of the registry bytes, its fetches, its turns to fetch.
pub(crate) struct LookupBounds {
    process: Arc<RegistryBytes>,
    /// This lookup's bytes in flight, at most `share`.
    bytes: AtomicUsize,
    share: usize,
    fetches: AtomicUsize,
    max_fetches: usize,
    at_once: Semaphore,
    waiting: Mutex<Waiting>,
}

/// What a lookup's requests are waiting for right now.
#[derive(Default)]
struct Waiting {
    /// Requests sent whose answer (status and headers) has not come, or whose error body is
    /// being read (a 5xx is the registry's failure, however its body ends).
    answers: usize,
    /// Manifest and blob bodies being read after a 200, by a number of their own: what each
    /// is (`sha256:…`, a tag), for the message.
    bodies: BTreeMap<u64, String>,
    next_body: u64,
}

impl LookupBounds {
    /// The bounds of an admission's lookup.
    pub(crate) fn new(process: Arc<RegistryBytes>) -> Self {
        Self::with_limits(process, LOOKUP_BYTES_SHARE, MAX_FETCHES_PER_LOOKUP)
    }

    pub(crate) fn with_limits(
        process: Arc<RegistryBytes>,
        share: usize,
        max_fetches: usize,
    ) -> Self {
        Self {
            process,
            bytes: AtomicUsize::new(0),
            share,
            fetches: AtomicUsize::new(0),
            max_fetches,
            at_once: Semaphore::new(FETCHES_AT_ONCE),
            waiting: Mutex::default(),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().expect("not poisoned")
    }

    /// Marks a request waiting for the registry's answer until the mark is dropped.
    pub(crate) fn awaiting_answer(&self) -> AwaitingAnswer<'_> {
        self.waiting().answers += 1;
        AwaitingAnswer { bounds: self }
    }

    /// Marks the body of `what` (a manifest or blob the registry answered 200 for) being read
    /// until the mark is dropped.
    pub(crate) fn reading_body(&self, what: &str) -> ReadingBody<'_> {
        let mut waiting = self.waiting();
        let number = waiting.next_body;
        waiting.next_body += 1;
        waiting.bodies.insert(number, what.to_owned());
        ReadingBody {
            bounds: self,
            number,
        }
    }

    /// When the lookup waits only on bodies the registry began to send (none of its requests
    /// still waits for an answer): what the first of them is. A lookup cut off by its deadline
    /// then stalled on the image's own content, not on the registry.
    pub(crate) fn stalled_body(&self) -> Option<String> {
        let waiting = self.waiting();
        if waiting.answers > 0 {
            return None;
        }
        waiting.bodies.values().next().cloned()
    }

    /// Counts one manifest or blob fetch and waits for a turn to make it (held while the
    /// request runs, never while a child is walked, so nested indexes cannot wait on each
    /// other). Past [`MAX_FETCHES_PER_LOOKUP`], the image is too costly to look up.
    pub(crate) async fn fetch_turn(&self) -> Result<SemaphorePermit<'_>, FetchError> {
        if self.fetches.fetch_add(1, Ordering::AcqRel) >= self.max_fetches {
            return Err(FetchError::OverLimit(format!(
                "more than {} manifests and blobs to read",
                self.max_fetches
            )));
        }
        Ok(self
            .at_once
            .acquire()
            .await
            .expect("the semaphore is never closed"))
    }

    /// An empty reservation against this lookup's share (and the process budget).
    pub(crate) fn reservation(&self) -> Reservation<'_> {
        Reservation {
            bounds: self,
            bytes: 0,
        }
    }
}

/// A request waiting for the registry's answer; see [`LookupBounds::awaiting_answer`].
pub(crate) struct AwaitingAnswer<'a> {
    bounds: &'a LookupBounds,
}

impl Drop for AwaitingAnswer<'_> {
    fn drop(&mut self) {
        self.bounds.waiting().answers -= 1;
    }
}

/// A manifest or blob body being read; see [`LookupBounds::reading_body`].
pub(crate) struct ReadingBody<'a> {
    bounds: &'a LookupBounds,
    number: u64,
}

impl Drop for ReadingBody<'_> {
    fn drop(&mut self) {
        self.bounds.waiting().bodies.remove(&self.number);
    }
}

/// Bytes held from a lookup's share and the process budget for one buffer; given back when
/// dropped, so it lives as long as the buffer it pays for.
pub(crate) struct Reservation<'a> {
    bounds: &'a LookupBounds,
    bytes: usize,
}

impl Reservation<'_> {
    /// Raises the reservation to `total` bytes, or says which bound refused (nothing taken).
    pub(crate) fn grow_to(&mut self, total: usize) -> Result<(), FetchError> {
        let extra = total.saturating_sub(self.bytes);
        if extra == 0 {
            return Ok(());
        }
        let bounds = self.bounds;
        let share = bounds
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(extra).filter(|&t| t <= bounds.share)
            });
        if share.is_err() {
            return Err(FetchError::OverLimit(format!(
                "more than {} MiB of manifests and blobs in flight at once",
                bounds.share >> 20
            )));
        }
        if !bounds.process.try_take(extra) {
            bounds.bytes.fetch_sub(extra, Ordering::AcqRel);
            return Err(FetchError::Busy);
        }
        self.bytes = total;
        Ok(())
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.bounds.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
            self.bounds.process.give_back(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_holds_at_most_its_share_and_gives_it_back() {
        let process = Arc::new(RegistryBytes::new(10, None));
        let first = LookupBounds::with_limits(process.clone(), 6, 1);
        let second = LookupBounds::with_limits(process.clone(), 6, 1);
        let mut a = first.reservation();
        a.grow_to(4).unwrap();
        let mut b = first.reservation();
        assert!(matches!(b.grow_to(3), Err(FetchError::OverLimit(_))));
        b.grow_to(2).unwrap();
        assert_eq!(process.in_flight(), 6);
        // The process budget is spent before the second lookup's share.
        let mut c = second.reservation();
        c.grow_to(4).unwrap();
        let mut d = second.reservation();
        assert_eq!(d.grow_to(1), Err(FetchError::Busy));
        assert_eq!(second.bytes.load(Ordering::Acquire), 4, "nothing kept");
        drop((a, b, c, d));
        assert_eq!(process.in_flight(), 0);
        assert_eq!(first.bytes.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_body_stalls_only_when_no_request_waits_for_an_answer() {
        let bounds = LookupBounds::new(Arc::new(RegistryBytes::new(1, None)));
        assert_eq!(bounds.stalled_body(), None);
        let answer = bounds.awaiting_answer();
        let config = bounds.reading_body("sha256:c0");
        assert_eq!(
            bounds.stalled_body(),
            None,
            "the registry has not answered yet"
        );
        drop(answer);
        let manifest = bounds.reading_body("v1");
        assert_eq!(bounds.stalled_body().as_deref(), Some("sha256:c0"));
        drop(config);
        assert_eq!(bounds.stalled_body().as_deref(), Some("v1"));
        drop(manifest);
        assert_eq!(bounds.stalled_body(), None);
    }

    #[tokio::test]
    async fn fetches_are_counted_and_refused_past_the_bound() {
        let bounds = LookupBounds::with_limits(Arc::new(RegistryBytes::new(1, None)), 1, 2);
        drop(bounds.fetch_turn().await.unwrap());
        drop(bounds.fetch_turn().await.unwrap());
        let err = bounds.fetch_turn().await.unwrap_err();
        assert_eq!(
            err,
            FetchError::OverLimit("more than 2 manifests and blobs to read".into())
        );
    }
}
