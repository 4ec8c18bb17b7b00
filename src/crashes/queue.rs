//! The crash watch's queue of BackOffs waiting to be looked at, fair across namespaces: each
//! namespace holds at most [`PER_NAMESPACE`] of the [`TOTAL`] places, the last [`NEWCOMERS`]
//! only for namespaces holding none, and they are looked at in turns, a namespace at a time.
//! A tenant whose Pods crash-loop by the thousand (an OOM, a bad config) then fills only its
//! own share and waits its turn; another namespace's crash is still looked at within a few
//! turns (a first-come queue let one tenant's BackOffs push every other namespace's out for
//! the whole window).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

/// Places in the queue, all namespaces together.
pub(crate) const TOTAL: usize = 64;
/// Places one namespace may hold.
pub(crate) const PER_NAMESPACE: usize = 8;
/// Of [`TOTAL`], the places only a namespace holding none may take: eight namespaces holding
/// their whole share never shut a ninth out.
pub(crate) const NEWCOMERS: usize = 16;

/// A bounded queue served round robin by namespace (one producer, one consumer).
pub(crate) struct FairQueue<T> {
    inner: Mutex<Waiting<T>>,
    ready: Notify,
}

struct Waiting<T> {
    by_namespace: BTreeMap<String, VecDeque<T>>,
    /// Namespaces with something waiting, in the order of their next turn.
    turns: VecDeque<String>,
    len: usize,
}

impl<T> Waiting<T> {
    fn has_room(&self, namespace: &str) -> bool {
        match self.by_namespace.get(namespace) {
            Some(queued) => queued.len() < PER_NAMESPACE && self.len < TOTAL - NEWCOMERS,
            None => self.len < TOTAL,
        }
    }
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Waiting {
                by_namespace: BTreeMap::new(),
                turns: VecDeque::new(),
                len: 0,
            }),
            ready: Notify::new(),
        }
    }
}

impl<T> FairQueue<T> {
    /// Whether `namespace` may queue one more now.
    pub(crate) fn has_room(&self, namespace: &str) -> bool {
        self.lock().has_room(namespace)
    }

    /// Queues `item` for `namespace`; false (and dropped) when there is no room for it.
    pub(crate) fn push(&self, namespace: &str, item: T) -> bool {
        let mut waiting = self.lock();
        if !waiting.has_room(namespace) {
            return false;
        }
        let queued = waiting
            .by_namespace
            .entry(namespace.to_owned())
            .or_default();
        queued.push_back(item);
        if queued.len() == 1 {
            waiting.turns.push_back(namespace.to_owned());
        }
        waiting.len += 1;
        drop(waiting);
        self.ready.notify_one();
        true
    }

    /// The next item: the oldest of the namespace whose turn it is.
    pub(crate) async fn pop(&self) -> T {
        loop {
            if let Some(item) = self.try_pop() {
                return item;
            }
            self.ready.notified().await;
        }
    }

    fn try_pop(&self) -> Option<T> {
        let mut waiting = self.lock();
        let namespace = waiting.turns.pop_front()?;
        let queued = waiting.by_namespace.get_mut(&namespace)?;
        let item = queued.pop_front();
        if queued.is_empty() {
            waiting.by_namespace.remove(&namespace);
        } else {
            waiting.turns.push_back(namespace);
        }
        waiting.len -= usize::from(item.is_some());
        item
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_holds_at_most_its_share_and_namespaces_take_turns() {
        let queue = FairQueue::default();
        let noisy: usize = (0..100).filter(|i| queue.push("noisy", *i)).count();
        assert_eq!(noisy, PER_NAMESPACE, "the noisy namespace's share");
        assert!(!queue.has_room("noisy"));
        assert!(queue.has_room("quiet"));
        assert!(queue.push("quiet", 1000));
        assert!(queue.push("quiet", 1001));
        // Turns: noisy's oldest, quiet's oldest, noisy, quiet, then noisy's rest.
        let order: Vec<usize> = std::iter::from_fn(|| queue.try_pop()).collect();
        assert_eq!(&order[..4], &[0, 1000, 1, 1001]);
        assert_eq!(order.len(), PER_NAMESPACE + 2);
        assert!(queue.try_pop().is_none());
    }

    #[test]
    fn namespaces_holding_their_whole_share_leave_room_for_others() {
        let queue = FairQueue::default();
        for n in 0..(TOTAL - NEWCOMERS) / PER_NAMESPACE {
            for i in 0..PER_NAMESPACE * 2 {
                queue.push(&format!("noisy-{n}"), i);
            }
        }
        assert_eq!(queue.lock().len, TOTAL - NEWCOMERS);
        assert!(!queue.has_room("noisy-0"));
        assert!(queue.has_room("quiet"));
        assert!(queue.push("quiet", 1));
        assert!(
            !queue.push("quiet", 2),
            "once it holds one, it is no newcomer"
        );
    }

    #[test]
    fn the_queue_holds_at_most_its_total_whatever_the_namespaces() {
        let queue = FairQueue::default();
        let queued = (0..TOTAL * 2)
            .filter(|i| queue.push(&format!("ns-{i}"), *i))
            .count();
        assert_eq!(queued, TOTAL);
        assert!(!queue.has_room("another"));
        queue.try_pop().unwrap();
        assert!(queue.has_room("another"));
    }
}
