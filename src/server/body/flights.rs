//! Body reads in flight, and eviction: when a body cannot be reserved because the process
//! budget (and, for a serving connection, the reserve) is spent, a body read that holds memory
//! without earning it is cut off and gives it back, and the newcomer is read once it has
//! (issue 34: "the one who exhausts the budget pays").
//!
//! A body read is tracked only once it has had to wait for bytes: a body that arrives with its
//! head (every ordinary admission) takes no lock and no clock here. Tracked reads are listed by
//! weak reference; the list is only walked on contention, once per victim, in O(bodies in
//! flight).
//!
//! Who pays: a peer address that holds more than the average of the peers holding bodies is
//! exhausting the budget. Its newcomers evict nothing (its other bodies hold what it would
//! need); a newcomer from a lighter peer (the API server's connections hold a few KiB each) may
//! evict one of its reads, the one silent longest. Without that rule an attacker's own
//! newcomers would evict its stalled bodies the moment they qualify and re-send fresh ones,
//! keeping every body too young to evict when the API server's request arrives; with it, the
//! attacker's bodies only age.
//!
//! Which reads qualify: those that have had no byte for [`SILENT_AFTER`], or that, at least
//! [`STALL_AFTER`] old, would not receive the rest of their body before their read deadline at
//! their average rate so far (a client trickling a byte now and then to never look silent). The
//! API server writes a body at once and at line rate: its reads are never silent for a quarter
//! of a second and finish far ahead of their deadline, and they are a light peer's anyway. A
//! client that stalls or trickles holds memory for a 408 it would get anyway, or for nothing.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::ByteBudget;

/// How long a body read may go without a byte before it counts as stalled: long for a body
/// written at once on the network the API server and the webhook share (and for a task of a
/// busy server to be polled), short against `request_read_timeout`.
pub(crate) const SILENT_AFTER: Duration = Duration::from_millis(250);
/// How old a body read must be before its average rate is judged.
pub(crate) const STALL_AFTER: Duration = Duration::from_secs(1);

const READING: u8 = 0;
const EVICTED: u8 = 1;
const DONE: u8 = 2;

/// When a body read began (its request's first byte) and when it must have ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
}

/// One tracked body read.
#[derive(Debug)]
pub(crate) struct Flight {
    window: Window,
    /// What the body may still grow to (its `Content-Length`, or the size limit).
    ceiling: usize,
    /// Its peer address's share.
    peer: Arc<ByteBudget>,
    /// Bytes of body received so far.
    received: AtomicUsize,
    /// When the last byte was received, in milliseconds since `window.started`.
    last_byte_ms: AtomicU64,
    /// Bytes its reservation holds now.
    held: AtomicUsize,
    state: AtomicU8,
    /// Woken when evicted.
    woken: Notify,
}

impl Flight {
    fn new(window: Window, (ceiling, peer): (usize, Arc<ByteBudget>), received: usize) -> Self {
        let flight = Self {
            window,
            ceiling,
            peer,
            received: AtomicUsize::new(received),
            last_byte_ms: AtomicU64::new(0),
            held: AtomicUsize::new(0),
            state: AtomicU8::new(READING),
            woken: Notify::new(),
        };
        flight.arrived(received);
        flight
    }

    /// `received` bytes of the body have arrived, the last just now.
    pub(crate) fn arrived(&self, received: usize) {
        self.received.store(received, Ordering::Relaxed);
        let since = Instant::now().saturating_duration_since(self.window.started);
        let ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
        self.last_byte_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn set_held(&self, bytes: usize) {
        self.held.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn is_evicted(&self) -> bool {
        self.state.load(Ordering::Acquire) == EVICTED
    }

    /// The body is read: no longer evictable. `false` if it was evicted first.
    pub(crate) fn finish(&self) -> bool {
        self.state
            .compare_exchange(READING, DONE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Resolves when the read has been evicted.
    pub(crate) async fn evicted(&self) {
        while !self.is_evicted() {
            self.woken.notified().await;
        }
    }

    /// How this read is doing at `now`.
    fn pace(&self, now: Instant) -> Pace {
        let age = now.saturating_duration_since(self.window.started);
        let last = Duration::from_millis(self.last_byte_ms.load(Ordering::Relaxed));
        Pace {
            age,
            silent: age.saturating_sub(last),
            received: self.received.load(Ordering::Relaxed),
            ceiling: self.ceiling,
            left: self.window.deadline.saturating_duration_since(now),
        }
    }
}

/// How a body read is doing, for the choice of victims.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    /// Since its request began.
    pub(crate) age: Duration,
    /// Since its last byte.
    pub(crate) silent: Duration,
    pub(crate) received: usize,
    pub(crate) ceiling: usize,
    /// Until its read deadline.
    pub(crate) left: Duration,
}

impl Pace {
    /// How long it has stalled, if it qualifies as a victim (see the module's doc): silent for
    /// [`SILENT_AFTER`], or too slow to finish by its deadline at its average rate so far
    /// (ranked as stalled since it began: it never finishes).
    pub(crate) fn stalled(self) -> Option<Duration> {
        if self.silent >= SILENT_AFTER {
            return Some(self.silent);
        }
        if self.age < STALL_AFTER {
            return None;
        }
        // received / age × left < ceiling − received, without dividing.
        let remaining = self.ceiling.saturating_sub(self.received) as u128;
        let late =
            (self.received as u128) * self.left.as_micros() < remaining * self.age.as_micros();
        late.then_some(self.age)
    }
}

/// The tracked body reads of the process.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    list: Mutex<List>,
    /// Reads evicted whose memory is not given back yet.
    pending: AtomicUsize,
    /// Woken when an evicted read has given its memory back.
    freed: Notify,
}

#[derive(Debug, Default)]
struct List {
    flights: Vec<Weak<Flight>>,
    /// Prune dead entries when the list reaches this length.
    prune_at: usize,
}

impl Flights {
    /// Tracks a body read that has had to wait for bytes (`ceiling`: what it may grow to;
    /// `peer`: its peer's share).
    pub(crate) fn track(
        &self,
        window: Window,
        ceiling: (usize, Arc<ByteBudget>),
        received: usize,
    ) -> Arc<Flight> {
        let flight = Arc::new(Flight::new(window, ceiling, received));
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        if list.flights.len() >= list.prune_at {
            list.flights.retain(|f| f.strong_count() > 0);
            list.prune_at = (2 * list.flights.len()).max(64);
        }
        list.flights.push(Arc::downgrade(&flight));
        flight
    }

    /// Evicts the read silent longest among those that hold memory, qualify, and are of a
    /// peer holding more than `average` (never `except`, the newcomer's own); whether one was.
    pub(crate) fn evict(&self, except: Option<&Arc<Flight>>, average: usize) -> bool {
        let now = Instant::now();
        let mut victim: Option<(Duration, Arc<Flight>)> = None;
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.flights.retain(|weak| {
            let Some(flight) = weak.upgrade() else {
                return false;
            };
            let own = except.is_some_and(|e| Arc::ptr_eq(e, &flight));
            let candidate = !own
                && flight.held.load(Ordering::Relaxed) > 0
                && flight.state.load(Ordering::Acquire) == READING
                && flight.peer.used() > average;
            if let Some(stalled) = candidate.then(|| flight.pace(now).stalled()).flatten() {
                if victim
                    .as_ref()
                    .is_none_or(|(longest, _)| stalled > *longest)
                {
                    victim = Some((stalled, flight));
                }
            }
            true
        });
        drop(list);
        let Some((_, flight)) = victim else {
            return false;
        };
        // Counted before the victim can see it evicted and give its memory back.
        self.pending.fetch_add(1, Ordering::AcqRel);
        let evicted = flight
            .state
            .compare_exchange(READING, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if evicted {
            flight.woken.notify_one();
        } else {
            // Read to its end meanwhile.
            self.released();
        }
        evicted
    }

    /// Evicted reads whose memory is not given back yet.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// An evicted read gave its memory back (or an eviction did not happen after all).
    pub(crate) fn released(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
        self.freed.notify_waiters();
    }

    /// Resolves at the next [`Self::released`] after it is first polled or enabled.
    pub(crate) fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        let list = self.list.lock().unwrap();
        list.flights.iter().filter(|f| f.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn pace(age_ms: u64, silent_ms: u64, received: usize, left_ms: u64) -> Pace {
        Pace {
            age: Duration::from_millis(age_ms),
            silent: Duration::from_millis(silent_ms),
            received,
            ceiling: 3 * MIB,
            left: Duration::from_millis(left_ms),
        }
    }

    #[test]
    fn stalled_and_trickling_reads_qualify_line_rate_ones_never() {
        let stalled = |p: Pace| p.stalled().map(|d| d.as_millis());
        // Silent for a quarter of a second, however much arrived before.
        assert_eq!(stalled(pace(300, 250, 10, 4_700)), Some(250));
        assert_eq!(stalled(pace(3_000, 2_000, 3 * MIB - 1, 2_000)), Some(2_000));
        // Young and receiving: no rate to judge yet.
        assert_eq!(stalled(pace(999, 249, 10, 4_001)), None);
        assert_eq!(stalled(pace(10, 0, 0, 4_990)), None);
        // Trickling: a byte every 200 ms never finishes 3 MiB in 4 s; ranked by its age.
        assert_eq!(stalled(pace(1_000, 200, 40, 4_000)), Some(1_000));
        // 1 MiB in 2 s with 3 s left delivers 1.5 MiB more: short of the 2 MiB still due.
        assert_eq!(stalled(pace(2_000, 0, MIB, 3_000)), Some(2_000));
        // 2 MiB in 2 s with 3 s left delivers 3 MiB more: on time.
        assert_eq!(stalled(pace(2_000, 0, 2 * MIB, 3_000)), None);
        // Line rate: most of it and still receiving, or all of it in a few milliseconds.
        assert_eq!(stalled(pace(1_200, 0, 3 * MIB - 100, 3_800)), None);
        assert_eq!(stalled(pace(5, 0, 3 * MIB, 4_995)), None);
    }

    fn window() -> Window {
        let started = Instant::now() - Duration::from_secs(2);
        Window {
            started,
            deadline: started + Duration::from_secs(5),
        }
    }

    /// A peer's share holding `used` bytes.
    fn peer(used: usize) -> Arc<ByteBudget> {
        let share = Arc::new(ByteBudget::new(usize::MAX));
        assert!(share.try_take(used));
        share
    }

    /// A tracked read of `received` bytes (as many held), its last byte `silent_ms` ago.
    fn flight(
        flights: &Flights,
        peer: &Arc<ByteBudget>,
        received: usize,
        silent_ms: u64,
    ) -> Arc<Flight> {
        let w = window();
        let f = flights.track(w, (3 * MIB, peer.clone()), received);
        f.set_held(received);
        f.last_byte_ms.store(2_000 - silent_ms, Ordering::Relaxed);
        f
    }

    /// Issue 34: the victim is the read silent longest of a peer above the average; a read
    /// receiving at line rate, a light peer's, one holding nothing, the newcomer's own, or one
    /// read to its end is never taken.
    #[test]
    fn the_victim_is_a_heavy_peers_read_silent_longest() {
        let flights = Flights::default();
        let (heavy, light) = (peer(20 * MIB), peer(MIB));
        let stalled = flight(&flights, &heavy, 10, 1_500);
        let longer = flight(&flights, &heavy, 10, 1_900);
        let fast = flight(&flights, &heavy, 2 * MIB, 0);
        let lights = flight(&flights, &light, 10, 2_000);
        let empty = flight(&flights, &heavy, 0, 2_000);
        let own = flight(&flights, &heavy, 10, 2_000);
        let done = flight(&flights, &heavy, 10, 2_000);
        assert!(done.finish());

        let average = 10 * MIB;
        assert!(flights.evict(Some(&own), average));
        assert!(longer.is_evicted(), "silent longest");
        assert!(!stalled.is_evicted(), "one victim at a time");
        assert_eq!(flights.pending(), 1);
        assert!(flights.evict(Some(&own), average));
        assert!(stalled.is_evicted());
        assert!(!flights.evict(Some(&own), average), "no other qualifies");
        assert!(!fast.is_evicted(), "receiving at line rate");
        assert!(!lights.is_evicted(), "a peer below the average");
        assert!(!empty.is_evicted(), "holds nothing");
        assert!(!own.is_evicted(), "the newcomer itself");
        assert!(!done.is_evicted() && !done.finish(), "read to its end");
        assert!(!stalled.finish(), "an evicted read stays evicted");
        assert_eq!(flights.pending(), 2);
        flights.released();
        flights.released();
        assert_eq!(flights.pending(), 0);
        // The light peer's read is taken once its peer is above the average.
        assert!(flights.evict(None, MIB / 2));
        assert!(lights.is_evicted());
    }

    #[test]
    fn dropped_reads_leave_the_list() {
        let flights = Flights::default();
        let share = peer(0);
        let kept = flights.track(window(), (MIB, share.clone()), 0);
        for _ in 0..200 {
            drop(flights.track(window(), (MIB, share.clone()), 0));
        }
        assert!(flights.list.lock().unwrap().flights.len() <= 128);
        assert_eq!(flights.tracked(), 1);
        drop(kept);
        assert!(!flights.evict(None, 0));
        assert!(flights.list.lock().unwrap().flights.is_empty());
    }
}
