//! Connection slots that a client cannot hoard: `max_connections` in all, at most
//! `max_connections_per_peer` for one peer address, and when either is reached the slot of a
//! connection that is doing nothing is taken back for the new one instead of refusing it.
//!
//! Which connection gives its slot up, and to whom:
//! - a new connection takes the slot of the oldest **pending** one (accepted, but no request
//!   answered yet: a TLS handshake or a first request head still to come). A reconnect flood
//!   (raw TCP connects, partial ClientHellos) therefore only ever replaces itself, and a new
//!   connection lives long enough to send its request (at 5,000 connects/s and 1,000 slots,
//!   about 200 ms, while a handshake on a LAN takes a few);
//! - a connection let in past the cap for a probe (`PROBE_CONNECTIONS`) that asks for anything
//!   else takes the slot of the longest **idle** keep-alive connection: first those that never
//!   had an admission answered (1,000 connections that sent one `GET /healthz` and idle hold
//!   nothing against a new `/mutate`), then those that did (the API server's, least recently
//!   used first).
//!
//! A connection with a request in progress is never taken back. A connection whose slot was
//! taken back still holds its file descriptor until its task notices, so at most
//! [`MAX_CLOSING`] may be closing at once (the open-files arithmetic counts them).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Connections whose slot was taken back and that have not closed yet, at most.
pub(crate) const MAX_CLOSING: usize = 64;

/// What a connection without a request in progress is doing, in the order slots are taken back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Standing {
    /// Idle after requests, none of them an admission answered.
    Idle,
    /// Accepted, no request answered yet.
    Pending,
    /// Idle after having answered an admission (the API server's connections).
    Serving,
}

/// The slots of one listener.
#[derive(Debug)]
pub(crate) struct Slots {
    table: Mutex<Table>,
    cap: usize,
    per_peer: usize,
    /// Woken when the last slot is given back (shutdown waits on it).
    emptied: Notify,
    /// Woken when a connection whose slot was taken back has closed.
    closed: Notify,
}

#[derive(Debug, Default)]
struct Table {
    /// Slots held by connections that were not taken back.
    open: usize,
    /// Connections taken back and not closed yet.
    closing: usize,
    /// Slots held per peer address (only addresses holding one).
    peers: HashMap<IpAddr, usize>,
    /// Connections with no request in progress, in the order their slots are taken back.
    reclaimable: BTreeMap<(Standing, u64), Arc<Entry>>,
    /// Each reclaimable connection's key in `reclaimable`, by its id.
    keys: HashMap<u64, (Standing, u64)>,
    /// Orders `reclaimable` within a standing: the oldest first.
    sequence: u64,
}

/// One connection's place in the table.
#[derive(Debug)]
struct Entry {
    id: u64,
    peer: IpAddr,
    /// Its slot was taken back: the connection is to close.
    reclaimed: AtomicBool,
    /// Its slot was given back (written under the table's lock).
    released: AtomicBool,
    wake: Notify,
}

/// A connection's slot, given back when dropped. The connection task holds it.
#[derive(Debug)]
pub(crate) struct Slot(SlotHandle);

/// What a connection's requests tell the table: busy, or idle again.
#[derive(Clone, Debug)]
pub(crate) struct SlotHandle {
    slots: Arc<Slots>,
    entry: Arc<Entry>,
}

impl Slots {
    pub(crate) fn new(cap: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::default(),
            cap,
            per_peer: per_peer.clamp(1, cap.max(1)),
            emptied: Notify::new(),
            closed: Notify::new(),
        })
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Counters and maps updated together under the lock; a panic cannot leave them half done.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A slot for a connection just accepted from `peer`: a free one, or a pending connection's
    /// (`peer`'s own when it is at its cap). `None`: refuse it (or let it in for probes only).
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        self.take(peer, &[Standing::Pending], Some(Standing::Pending))
    }

    /// A slot for a request that arrived on a connection let in past the cap: a free one, or an
    /// idle connection's (`peer`'s own when it is at its cap). Not reclaimable until idle.
    pub(crate) fn promote(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        self.take(peer, &[Standing::Idle, Standing::Serving], None)
    }

    fn take(
        self: &Arc<Self>,
        peer: IpAddr,
        victims: &[Standing],
        standing: Option<Standing>,
    ) -> Option<Slot> {
        let peer = peer.to_canonical();
        let mut table = self.table();
        let peer_full = table.peers.get(&peer).copied().unwrap_or(0) >= self.per_peer;
        if peer_full || table.open >= self.cap {
            if table.closing >= MAX_CLOSING {
                return None;
            }
            let victim = table.oldest(victims, peer_full.then_some(peer))?;
            table.reclaim(&victim);
        } else {
            table.open += 1;
        }
        *table.peers.entry(peer).or_default() += 1;
        table.sequence += 1;
        let entry = Arc::new(Entry {
            id: table.sequence,
            peer,
            reclaimed: AtomicBool::new(false),
            released: AtomicBool::new(false),
            wake: Notify::new(),
        });
        if let Some(standing) = standing {
            table.insert(standing, &entry);
        }
        Some(Slot(SlotHandle {
            slots: self.clone(),
            entry,
        }))
    }

    /// Resolves once fewer than [`MAX_CLOSING`] connections whose slots were taken back are
    /// still closing (at once if so already).
    pub(crate) async fn room_to_reclaim(&self) {
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.table().closing < MAX_CLOSING {
                return;
            }
            closed.await;
        }
    }

    /// Slots held now (connections taken back and still closing included).
    pub(crate) fn held(&self) -> usize {
        let table = self.table();
        table.open + table.closing
    }

    /// Resolves once every slot has been given back.
    pub(crate) async fn all_closed(&self) {
        loop {
            let emptied = self.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            if self.held() == 0 {
                return;
            }
            emptied.await;
        }
    }
}

impl Table {
    /// The connection to take back: the first of `standings` that has one, the oldest in it;
    /// only `peer`'s when given.
    fn oldest(&self, standings: &[Standing], peer: Option<IpAddr>) -> Option<Arc<Entry>> {
        standings.iter().find_map(|&standing| {
            self.reclaimable
                .range((standing, 0)..=(standing, u64::MAX))
                .map(|(_, entry)| entry)
                .find(|entry| peer.is_none_or(|peer| entry.peer == peer))
                .cloned()
        })
    }

    /// Takes `victim`'s slot back: it is told to close, and counts as closing until it has.
    fn reclaim(&mut self, victim: &Arc<Entry>) {
        self.remove(victim);
        self.forget_peer(victim.peer);
        self.closing += 1;
        victim.reclaimed.store(true, Ordering::Release);
        victim.wake.notify_one();
    }

    fn insert(&mut self, standing: Standing, entry: &Arc<Entry>) {
        self.sequence += 1;
        let key = (standing, self.sequence);
        self.reclaimable.insert(key, entry.clone());
        self.keys.insert(entry.id, key);
    }

    fn remove(&mut self, entry: &Entry) {
        if let Some(key) = self.keys.remove(&entry.id) {
            self.reclaimable.remove(&key);
        }
    }

    fn forget_peer(&mut self, peer: IpAddr) {
        if let Some(held) = self.peers.get_mut(&peer) {
            *held -= 1;
            if *held == 0 {
                self.peers.remove(&peer);
            }
        }
    }
}

impl Slot {
    /// What the connection's requests use to tell the table what it is doing.
    pub(crate) fn handle(&self) -> SlotHandle {
        self.0.clone()
    }

    /// Resolves when the slot has been taken back: the connection is to close.
    pub(crate) async fn reclaimed(&self) {
        let entry = &self.0.entry;
        while !entry.reclaimed.load(Ordering::Acquire) {
            entry.wake.notified().await;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let SlotHandle { slots, entry } = &self.0;
        let mut table = slots.table();
        if entry.reclaimed.load(Ordering::Acquire) {
            table.closing -= 1;
            slots.closed.notify_waiters();
        } else {
            table.remove(entry);
            table.forget_peer(entry.peer);
            table.open -= 1;
        }
        entry.released.store(true, Ordering::Release);
        if table.open + table.closing == 0 {
            slots.emptied.notify_waiters();
        }
    }
}

impl SlotHandle {
    /// A request is in progress: the slot is not taken back meanwhile.
    pub(crate) fn busy(&self) {
        self.slots.table().remove(&self.entry);
    }

    /// No request is in progress any more.
    pub(crate) fn idle(&self, standing: Standing) {
        let mut table = self.slots.table();
        let entry = &self.entry;
        if entry.released.load(Ordering::Acquire) || entry.reclaimed.load(Ordering::Acquire) {
            return;
        }
        table.remove(entry);
        table.insert(standing, entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn new_connections_take_back_pending_ones_never_busy_or_idle_ones() {
        let slots = Slots::new(3, 3);
        let a = ip("10.0.0.1");
        let pending = slots.admit(a).unwrap();
        let busy = slots.admit(a).unwrap();
        busy.handle().busy();
        let idle = slots.admit(a).unwrap();
        idle.handle().busy();
        idle.handle().idle(Standing::Idle);
        // Full: the pending connection's slot goes to the next one.
        let next = slots.admit(a).unwrap();
        assert!(pending.0.entry.reclaimed.load(Ordering::Acquire));
        assert_eq!(slots.held(), 4, "three open and one closing");
        // Only busy and idle ones left besides the newest pending one, which goes next.
        let last = slots.admit(a).unwrap();
        assert!(next.0.entry.reclaimed.load(Ordering::Acquire));
        next.handle().busy(); // too late: it is closing, and stays so
        drop((pending, next));
        assert_eq!(slots.held(), 3);
        last.handle().busy();
        assert!(slots.admit(a).is_none(), "nothing pending to take back");
        assert!(!idle.0.entry.reclaimed.load(Ordering::Acquire));
        drop((busy, idle, last));
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn requests_past_the_cap_take_back_the_longest_idle_non_serving_connection_first() {
        let slots = Slots::new(3, 3);
        let a = ip("10.0.0.1");
        let [serving, older, newer] = [0, 1, 2].map(|_| slots.admit(a).unwrap());
        for (slot, standing) in [
            (&serving, Standing::Serving),
            (&older, Standing::Idle),
            (&newer, Standing::Idle),
        ] {
            slot.handle().busy();
            slot.handle().idle(standing);
        }
        assert!(slots.admit(a).is_none(), "none pending");
        let first = slots.promote(a).unwrap();
        assert!(older.0.entry.reclaimed.load(Ordering::Acquire));
        let second = slots.promote(a).unwrap();
        assert!(newer.0.entry.reclaimed.load(Ordering::Acquire));
        let third = slots.promote(a).unwrap();
        assert!(serving.0.entry.reclaimed.load(Ordering::Acquire));
        assert!(slots.promote(a).is_none(), "the promoted ones are busy");
        drop((serving, older, newer, first, second, third));
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn a_peer_at_its_cap_only_takes_back_its_own_connections() {
        let slots = Slots::new(4, 2);
        let (a, b) = (ip("10.0.0.1"), ip("::ffff:10.0.0.2"));
        let a1 = slots.admit(a).unwrap();
        let a2 = slots.admit(a).unwrap();
        let b1 = slots.admit(b).unwrap();
        a2.handle().busy();
        // a is at its cap (the server is not): a's own pending connection goes, though b's is
        // pending too.
        let a3 = slots.admit(a).unwrap();
        assert!(a1.0.entry.reclaimed.load(Ordering::Acquire));
        assert!(!b1.0.entry.reclaimed.load(Ordering::Acquire));
        a3.handle().busy();
        assert!(slots.admit(a).is_none(), "a's own are all busy");
        // b, first seen as an IPv4-mapped address, is the same peer as 10.0.0.2: its second
        // connection fills its cap, its third takes its first one's slot.
        let b2 = slots.admit(ip("10.0.0.2")).unwrap();
        b2.handle().busy();
        assert!(!b1.0.entry.reclaimed.load(Ordering::Acquire));
        let b3 = slots.admit(ip("10.0.0.2")).unwrap();
        assert!(b1.0.entry.reclaimed.load(Ordering::Acquire));
        drop((a1, a2, a3, b1, b2, b3));
        assert_eq!(slots.held(), 0);
        assert!(slots.table().peers.is_empty());
    }

    #[test]
    fn few_connections_close_at_once() {
        let slots = Slots::new(1, 1);
        let a = ip("10.0.0.1");
        let mut closing = Vec::new();
        let mut current = slots.admit(a).unwrap();
        for _ in 0..MAX_CLOSING {
            let next = slots.admit(a).unwrap();
            closing.push(std::mem::replace(&mut current, next));
        }
        assert!(slots.admit(a).is_none(), "{MAX_CLOSING} closing already");
        closing.pop();
        assert!(slots.admit(a).is_some());
    }
}
