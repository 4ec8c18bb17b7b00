//! What one lookup may cost, whatever the registry serves: the bytes of registry answers it
//! holds while they arrive (its share of a process-wide budget), and the manifests and blobs its
//! walk fetches — counted over the whole tree, however its indexes nest, a few at a time.
//!
//! Each index is already bounded on its own (entries, depth), but a tree of indexes multiplies
//! those bounds, and a registry that sends 4 MiB − 2 bytes of each child and stalls would make
//! every child hold its buffer. These bounds hold per lookup: a lookup that reaches them ends
//! as the image's own failure ([`FetchError::OverLimit`]), never the registry's.
//!
//! The process-wide budget is shared fairly: the lookups of one registry host hold at most
//! [`REGISTRY_BYTES_SHARE`] of it together, and so do those of one namespace, so a registry
//! that stalls its answers spends its own share, not everyone's. A lookup that finds no room
//! (in the budget, its host's or its namespace's share) waits for some within its own deadline
//! instead of failing at once; cut off while waiting, it is busy (tolerable's bound, never its
//! registry's breaker), while the lookups holding the bytes end as stalled.
//!
//! A lookup also knows what its requests are waiting for — the registry's answer (status and
//! headers), or the rest of a manifest or blob it has begun to send — so that a lookup cut off
//! by its deadline can be told apart: a registry that did not answer is the registry's failure
//! (its circuit breaker counts it), an image whose answer stalled after its headers is the
//! image's own ([`LookupBounds::stalled_body`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

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
/// What the lookups of one registry host may hold of [`REGISTRY_BYTES_BUDGET`] together, and
/// what the lookups of one namespace may: a registry that sends 4 MiB − 2 bytes of each answer
/// and stalls fills its own share (three such answers), and the rest waits for room there,
/// while every other registry's and namespace's lookups find room (issue 34).
pub(crate) const REGISTRY_BYTES_SHARE: usize = 12 << 20;
/// Manifests and blobs one lookup fetches at most, over the whole walk (mirror, origin and
/// every credential tried). A real image needs one (an index whose entries name their
/// platforms) to a few (a single manifest and its config); an index of 31 entries without
/// platforms still fits. A hostile tree of nested indexes would otherwise cost tens of
/// thousands of requests.
pub(crate) const MAX_FETCHES_PER_LOOKUP: usize = 64;
/// Manifests and blobs one lookup fetches at the same time, however many indexes it walks.
pub(crate) const FETCHES_AT_ONCE: usize = 4;

/// The process-wide budget of registry bytes in flight, with each registry host's and each
/// namespace's share of it.
pub(crate) struct RegistryBytes {
    held: Mutex<Held>,
    /// `held.total`, for scrapes.
    in_flight: AtomicUsize,
    limit: usize,
    share: usize,
    /// Woken whenever bytes are given back: lookups waiting for room look again.
    room: Notify,
    /// Told every change, so `tolerable_registry_bytes_in_flight` follows it.
    observer: Option<Arc<dyn RegistryObserver>>,
}

/// Bytes held, in all and by each holder (only holders holding some).
#[derive(Default)]
struct Held {
    total: usize,
    hosts: HashMap<String, usize>,
    namespaces: HashMap<String, usize>,
}

/// Who bytes are held for: a registry host, and the namespace of the Pod that asked (none for
/// `inspect`, `review` and the like).
#[derive(Clone, Copy)]
struct Holder<'a> {
    host: &'a str,
    namespace: Option<&'a str>,
}

impl RegistryBytes {
    pub(crate) fn new(limit: usize, observer: Option<Arc<dyn RegistryObserver>>) -> Self {
        Self::with_share(limit, REGISTRY_BYTES_SHARE.min(limit), observer)
    }

    pub(crate) fn with_share(
        limit: usize,
        share: usize,
        observer: Option<Arc<dyn RegistryObserver>>,
    ) -> Self {
        Self {
            held: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            limit,
            share,
            room: Notify::new(),
            observer,
        }
    }

    /// Bytes held now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        // Counters only, updated together: consistent whatever panicked.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `bytes` could ever be taken for one holder (then waiting makes sense).
    fn could_fit(&self, bytes: usize) -> bool {
        bytes <= self.limit.min(self.share)
    }

    fn try_take(&self, holder: Holder<'_>, bytes: usize) -> bool {
        let mut held = self.held();
        let host = held.hosts.get(holder.host).copied().unwrap_or(0);
        let namespace = holder
            .namespace
            .map_or(0, |n| held.namespaces.get(n).copied().unwrap_or(0));
        let fits = |used: usize, limit: usize| used.checked_add(bytes).is_some_and(|t| t <= limit);
        if !(fits(held.total, self.limit) && fits(host, self.share) && fits(namespace, self.share))
        {
            return false;
        }
        held.total += bytes;
        *held.hosts.entry(holder.host.to_owned()).or_default() += bytes;
        if let Some(namespace) = holder.namespace {
            *held.namespaces.entry(namespace.to_owned()).or_default() += bytes;
        }
        self.in_flight.store(held.total, Ordering::Release);
        drop(held);
        self.tell(i64::try_from(bytes).unwrap_or(i64::MAX));
        true
    }

    fn give_back(&self, holder: Holder<'_>, bytes: usize) {
        let mut held = self.held();
        held.total -= bytes;
        let release = |map: &mut HashMap<String, usize>, key: &str| {
            if let Some(used) = map.get_mut(key) {
                *used -= bytes;
                if *used == 0 {
                    map.remove(key);
                }
            }
        };
        release(&mut held.hosts, holder.host);
        if let Some(namespace) = holder.namespace {
            release(&mut held.namespaces, namespace);
        }
        self.in_flight.store(held.total, Ordering::Release);
        drop(held);
        self.room.notify_waiters();
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
    /// The namespace of the Pod the lookup is for, when known: its share is the namespace's.
    namespace: Option<String>,
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
    /// is (`sha256:…`, a tag), for the message, and whether it waits for room in the registry
    /// bytes (then it is not stalling: the budget is spent by others).
    bodies: BTreeMap<u64, (String, bool)>,
    next_body: u64,
    /// Time some body of the lookup waited for room, ended waits summed…
    room_waited: Duration,
    /// …and when the wait under way (if any body waits for room now) began.
    room_since: Option<Instant>,
}

impl Waiting {
    /// Keeps the time spent waiting for room as bodies begin and end their waits: any body
    /// waiting counts once, however many wait together.
    fn note_room_waits(&mut self) {
        let any_waits = self.bodies.values().any(|(_, for_room)| *for_room);
        match (any_waits, self.room_since) {
            (true, None) => self.room_since = Some(Instant::now()),
            (false, Some(since)) => {
                self.room_waited += since.elapsed();
                self.room_since = None;
            }
            _ => {}
        }
    }
}

impl LookupBounds {
    /// The bounds of an admission's lookup for a Pod in `namespace` (when known).
    pub(crate) fn new(process: Arc<RegistryBytes>, namespace: Option<&str>) -> Self {
        let mut bounds = Self::with_limits(process, LOOKUP_BYTES_SHARE, MAX_FETCHES_PER_LOOKUP);
        bounds.namespace = namespace.map(str::to_owned);
        bounds
    }

    pub(crate) fn with_limits(
        process: Arc<RegistryBytes>,
        share: usize,
        max_fetches: usize,
    ) -> Self {
        Self {
            process,
            namespace: None,
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
        waiting.bodies.insert(number, (what.to_owned(), false));
        ReadingBody {
            bounds: self,
            number,
            what: what.to_owned(),
        }
    }

    /// When the lookup waits only on bodies the registry began to send (none of its requests
    /// still waits for an answer, none of those bodies waits for room): what the first of them
    /// is. A lookup cut off by its deadline then stalled on the image's own content, not on
    /// the registry.
    pub(crate) fn stalled_body(&self) -> Option<String> {
        let waiting = self.waiting();
        if waiting.answers > 0 {
            return None;
        }
        let stalled = waiting.bodies.values().find(|(_, for_room)| !for_room);
        stalled.map(|(what, _)| what.clone())
    }

    /// Whether the lookup waits for nothing but room in the registry bytes (no request waits
    /// for an answer, no body stalls): cut off by its deadline, it was busy, through no fault
    /// of its registry's.
    pub(crate) fn waiting_for_room(&self) -> bool {
        let waiting = self.waiting();
        waiting.answers == 0
            && !waiting.bodies.is_empty()
            && waiting.bodies.values().all(|(_, for_room)| *for_room)
    }

    /// How long, so far, the lookup's bodies waited for room in the registry bytes others held:
    /// time its registry did not have.
    pub(crate) fn waited_for_room(&self) -> Duration {
        let waiting = self.waiting();
        waiting.room_waited + waiting.room_since.map_or(Duration::ZERO, |t| t.elapsed())
    }

    fn mark_room(&self, body: Option<u64>, for_room: bool) {
        if let Some(number) = body {
            let mut waiting = self.waiting();
            if let Some(entry) = waiting.bodies.get_mut(&number) {
                entry.1 = for_room;
            }
            waiting.note_room_waits();
        }
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

    /// An empty reservation against this lookup's share and the process budget, for an answer
    /// of `host` (`body`: the manifest or blob it is, when one).
    pub(crate) fn reservation<'a>(
        &'a self,
        host: &'a str,
        body: Option<&ReadingBody<'_>>,
    ) -> Reservation<'a> {
        Reservation {
            bounds: self,
            host,
            body: body.map(|b| b.number),
            bytes: 0,
        }
    }

    fn holder<'a>(&'a self, host: &'a str) -> Holder<'a> {
        Holder {
            host,
            namespace: self.namespace.as_deref(),
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
    what: String,
}

impl ReadingBody<'_> {
    /// What is being read (`sha256:…`, a tag).
    pub(crate) fn what(&self) -> &str {
        &self.what
    }
}

impl Drop for ReadingBody<'_> {
    fn drop(&mut self) {
        let mut waiting = self.bounds.waiting();
        waiting.bodies.remove(&self.number);
        waiting.note_room_waits();
    }
}

/// Bytes held from a lookup's share and the process budget (its host's and namespace's shares)
/// for one buffer; given back when dropped, so it lives as long as the buffer it pays for.
pub(crate) struct Reservation<'a> {
    bounds: &'a LookupBounds,
    host: &'a str,
    body: Option<u64>,
    bytes: usize,
}

impl Reservation<'_> {
    /// Raises the reservation to `total` bytes, or says which bound refused (nothing taken).
    /// Past the lookup's own share it is the image's failure at once; when the process budget,
    /// the host's or the namespace's share has no room, it waits for room (its lookup's
    /// deadline bounds the wait: cut off there, it ends as busy, see
    /// [`LookupBounds::waiting_for_room`]).
    pub(crate) async fn grow_to(&mut self, total: usize) -> Result<(), FetchError> {
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
        // Given back unless taken: refused, or cut off while waiting.
        let mut pending = PendingShare {
            bounds,
            host: self.host,
            extra,
            body: self.body,
            waited: false,
        };
        let process = &bounds.process;
        if !process.could_fit(extra) {
            return Err(FetchError::Busy);
        }
        loop {
            let room = process.room.notified();
            tokio::pin!(room);
            // Registered before looking, so bytes given back meanwhile wake it.
            room.as_mut().enable();
            if process.try_take(bounds.holder(self.host), extra) {
                pending.taken();
                self.bytes = total;
                return Ok(());
            }
            pending.waiting();
            room.await;
        }
    }
}

/// A reservation's growth under way: its bytes of the lookup's share, and whether it waited for
/// room (told to the observer, and marked on its body for the deadline's verdict).
struct PendingShare<'a> {
    bounds: &'a LookupBounds,
    host: &'a str,
    extra: usize,
    body: Option<u64>,
    waited: bool,
}

impl PendingShare<'_> {
    fn waiting(&mut self) {
        if !self.waited {
            self.waited = true;
            self.bounds.mark_room(self.body, true);
        }
    }

    /// The bytes are taken: nothing to give back.
    fn taken(&mut self) {
        if self.waited {
            self.bounds.mark_room(self.body, false);
            self.tell("room");
        }
        self.extra = 0;
    }

    fn tell(&self, result: &'static str) {
        if let Some(observer) = &self.bounds.process.observer {
            observer.registry_bytes_wait(self.host, result);
        }
    }
}

impl Drop for PendingShare<'_> {
    fn drop(&mut self) {
        if self.extra > 0 {
            self.bounds.bytes.fetch_sub(self.extra, Ordering::AcqRel);
            if self.waited {
                self.tell("deadline");
            }
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let bounds = self.bounds;
            bounds.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
            bounds
                .process
                .give_back(bounds.holder(self.host), self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `grow_to` that must not wait: `None` when it would.
    fn now(
        grow: impl std::future::Future<Output = Result<(), FetchError>>,
    ) -> Option<Result<(), FetchError>> {
        use futures_util::FutureExt as _;
        grow.now_or_never()
    }

    #[test]
    fn a_lookup_holds_at_most_its_share_and_gives_it_back() {
        let process = Arc::new(RegistryBytes::with_share(10, 10, None));
        let first = LookupBounds::with_limits(process.clone(), 6, 1);
        let second = LookupBounds::with_limits(process.clone(), 6, 1);
        let mut a = first.reservation("r.example", None);
        now(a.grow_to(4)).unwrap().unwrap();
        let mut b = first.reservation("r.example", None);
        assert!(matches!(
            now(b.grow_to(3)),
            Some(Err(FetchError::OverLimit(_)))
        ));
        now(b.grow_to(2)).unwrap().unwrap();
        assert_eq!(process.in_flight(), 6);
        // The process budget is spent before the second lookup's share: it waits for room.
        let mut c = second.reservation("r.example", None);
        now(c.grow_to(4)).unwrap().unwrap();
        let mut d = second.reservation("r.example", None);
        assert_eq!(now(d.grow_to(1)), None, "waits");
        assert_eq!(second.bytes.load(Ordering::Acquire), 4, "nothing kept");
        drop((a, b, c, d));
        assert_eq!(process.in_flight(), 0);
        assert_eq!(first.bytes.load(Ordering::Acquire), 0);
    }

    /// Issue 34: a host's lookups hold at most its share; another host's (and another
    /// namespace's) find room meanwhile, and a lookup waiting for room in its host's share gets
    /// it when bytes are given back — and is marked busy, not stalled, while it waits.
    #[tokio::test]
    async fn each_host_and_namespace_holds_its_own_share_and_waiters_get_room() {
        let process = Arc::new(RegistryBytes::with_share(10, 4, None));
        let lookup = |namespace| LookupBounds {
            namespace: Some(String::from(namespace)),
            ..LookupBounds::with_limits(process.clone(), 10, 8)
        };
        let (hostile, victim, same_ns) = (lookup("evil"), lookup("ok"), lookup("evil"));
        let mut held = hostile.reservation("evil.example", None);
        now(held.grow_to(4)).unwrap().unwrap();
        let body = victim.reading_body("sha256:c0");
        let mut fine = victim.reservation("good.example", Some(&body));
        now(fine.grow_to(4)).unwrap().unwrap();
        drop(fine);
        // Its namespace's share is spent too, on another host.
        let mut other_host = same_ns.reservation("other.example", None);
        assert_eq!(now(other_host.grow_to(1)), None, "the namespace's share");

        let waiter_body = hostile.reading_body("sha256:c1");
        let mut waiter = hostile.reservation("evil.example", Some(&waiter_body));
        {
            let grow = waiter.grow_to(2);
            tokio::pin!(grow);
            assert!(futures_util::poll!(grow.as_mut()).is_pending());
            assert!(hostile.waiting_for_room(), "busy, not stalled");
            assert_eq!(hostile.stalled_body(), None);
            drop(held);
            grow.await.unwrap();
        }
        assert!(!hostile.waiting_for_room());
        assert_eq!(hostile.stalled_body().as_deref(), Some("sha256:c1"));
        assert_eq!(process.in_flight(), 2);
        drop((waiter, waiter_body, body));
        assert_eq!(process.in_flight(), 0);
        assert!(process.held().hosts.is_empty() && process.held().namespaces.is_empty());
    }

    /// The time a lookup's bodies waited for room is summed, once for bodies waiting together,
    /// and stops when the room is taken: the deadline's verdict subtracts it from the time the
    /// registry had.
    #[tokio::test]
    async fn time_waiting_for_room_is_counted_once_and_stops_with_the_room() {
        let process = Arc::new(RegistryBytes::with_share(4, 4, None));
        let (holder, waiter) = (
            LookupBounds::with_limits(process.clone(), 4, 8),
            LookupBounds::with_limits(process.clone(), 4, 8),
        );
        let mut held = holder.reservation("r.example", None);
        now(held.grow_to(4)).unwrap().unwrap();
        let (first, second) = (
            waiter.reading_body("sha256:a"),
            waiter.reading_body("sha256:b"),
        );
        let (mut a, mut b) = (
            waiter.reservation("r.example", Some(&first)),
            waiter.reservation("r.example", Some(&second)),
        );
        let began = Instant::now();
        {
            let (grow_a, grow_b) = (a.grow_to(1), b.grow_to(1));
            tokio::pin!(grow_a, grow_b);
            assert!(futures_util::poll!(grow_a.as_mut()).is_pending());
            assert!(futures_util::poll!(grow_b.as_mut()).is_pending());
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(waiter.waited_for_room() >= Duration::from_millis(50));
            drop(held);
            grow_a.await.unwrap();
            grow_b.await.unwrap();
        }
        let waited = waiter.waited_for_room();
        // Two bodies waited together: counted once, never more than the time that passed.
        assert!(waited <= began.elapsed(), "{waited:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            waiter.waited_for_room(),
            waited,
            "stopped when the room was taken"
        );
        assert_eq!(holder.waited_for_room(), Duration::ZERO);
    }

    #[test]
    fn a_body_stalls_only_when_no_request_waits_for_an_answer() {
        let bounds = LookupBounds::new(Arc::new(RegistryBytes::new(1, None)), None);
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
