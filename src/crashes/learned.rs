//! What the crash watch learned (issue 38): "digest D does not run on architecture A", kept in
//! memory, where admissions read it, and — with the shared cache (`[shared_cache] url`) — in
//! the shared store ([`super::shared`]) too, so every replica, `review`, `audit` and
//! `tolerable crashes list | forget` see what the leading replica learned.
//!
//! With the shared store, the memory is a read-through cache over it: `serve` pulls the store
//! every [`REFRESH_EVERY`], and reads it whole only when its version changed (one GET
//! otherwise). An admission reads memory only — never a Redis round trip on the warm path — and
//! a crash is learned seconds to minutes after its Pods were admitted anyway, so a few seconds
//! more before other replicas see it change nothing a lookup-triggered read would have saved.
//! `review` and `audit` read the store once, on their first decision.
//!
//! Bounded: [`MAX_LEARNED`] digests in all, [`MAX_PER_NAMESPACE`] taught by one namespace's
//! crashes (past it, that namespace's own oldest is forgotten, never another's), each for
//! [`LEARNED_TTL`] — in memory as in the store.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;
use tokio::task::JoinHandle;

use super::shared::{LearnedEntry, SharedLearned};
use crate::registry::SharedCacheSettings;

/// How long "digest D does not run on architecture A" is kept: a fixed tag gets a new digest.
pub(crate) const LEARNED_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Digests remembered at most (the oldest forgotten first).
pub const MAX_LEARNED: usize = 1024;
/// Digests one namespace's crashes may have taught at most (an eighth of all).
pub const MAX_PER_NAMESPACE: usize = MAX_LEARNED / 8;
/// How often `serve` asks the shared store whether anything changed.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// The digests learned not to run on architectures their index claims. Clones share it.
#[derive(Clone, Default)]
pub(crate) struct Learned {
    inner: Arc<Mutex<LearnedMap>>,
    shared: Option<Arc<SharedLearned>>,
    /// `review`, `audit`: the store read once, on the first decision (`serve` refreshes).
    once: Option<Arc<OnceCell<()>>>,
}

struct Entry {
    archs: Vec<String>,
    namespace: String,
    expires: Instant,
    /// Read from (or written to) the shared store: dropped when a refresh no longer finds it
    /// (forgotten there). An entry whose write failed stays in this replica's memory.
    shared: bool,
}

#[derive(Default)]
struct LearnedMap {
    by_digest: HashMap<String, Entry>,
    /// The digests, oldest first.
    order: VecDeque<String>,
    per_namespace: HashMap<String, usize>,
}

impl LearnedMap {
    fn insert(
        &mut self,
        namespace: &str,
        digest: &str,
        arch: &str,
        expires: Instant,
    ) -> &mut Entry {
        if !self.by_digest.contains_key(digest) {
            self.make_room(namespace);
            self.order.push_back(digest.to_owned());
            *self.per_namespace.entry(namespace.to_owned()).or_default() += 1;
        }
        let entry = self
            .by_digest
            .entry(digest.to_owned())
            .or_insert_with(|| Entry {
                archs: Vec::new(),
                namespace: namespace.to_owned(),
                expires,
                shared: false,
            });
        entry.expires = entry.expires.max(expires);
        if !entry.archs.iter().any(|a| a == arch)
            && entry.archs.len() < super::shared::MAX_ARCHITECTURES
        {
            entry.archs.push(arch.to_owned());
        }
        entry
    }

    /// Room for one more digest taught by `namespace`: its own oldest goes when it holds its
    /// share, else the oldest of all when full.
    fn make_room(&mut self, namespace: &str) {
        let held = self.per_namespace.get(namespace).copied().unwrap_or(0);
        let evicted = if held >= MAX_PER_NAMESPACE {
            let by_digest = &self.by_digest;
            let at = self
                .order
                .iter()
                .position(|d| by_digest.get(d).is_some_and(|e| e.namespace == namespace));
            at.and_then(|at| self.order.remove(at))
        } else if self.by_digest.len() >= MAX_LEARNED {
            self.order.pop_front()
        } else {
            None
        };
        if let Some(digest) = evicted {
            self.remove(&digest);
        }
    }

    fn remove(&mut self, digest: &str) {
        let Some(entry) = self.by_digest.remove(digest) else {
            return;
        };
        if let Some(count) = self.per_namespace.get_mut(&entry.namespace) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_namespace.remove(&entry.namespace);
            }
        }
    }
}

impl Learned {
    /// Kept in the shared store of `settings` too; `serve` refreshes it ([`Learned::refresh`]).
    pub(crate) fn refreshed(settings: SharedCacheSettings) -> Result<Self, String> {
        Ok(Self {
            shared: Some(Arc::new(SharedLearned::new(settings)?)),
            ..Self::default()
        })
    }

    /// Read from the shared store of `settings` once, on the first decision (`review`, `audit`).
    pub(crate) fn read_once(settings: SharedCacheSettings) -> Result<Self, String> {
        Ok(Self {
            once: Some(Arc::new(OnceCell::new())),
            ..Self::refreshed(settings)?
        })
    }

    fn lock(&self) -> MutexGuard<'_, LearnedMap> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `digest` does not run on `arch`, taught by a crash in `namespace`, as of `now` (memory).
    pub(crate) fn learn(&self, namespace: &str, digest: &str, arch: &str, now: Instant) {
        let mut map = self.lock();
        let entry = map.insert(namespace, digest, arch, now + LEARNED_TTL);
        entry.expires = now + LEARNED_TTL;
    }

    /// [`Learned::learn`], and in the shared store when there is one (a failure is logged: the
    /// entry stays in this replica's memory).
    pub(crate) async fn learn_everywhere(&self, namespace: &str, digest: &str, arch: &str) {
        self.learn(namespace, digest, arch, Instant::now());
        let Some(shared) = &self.shared else { return };
        match shared.learn(namespace, digest, arch, LEARNED_TTL).await {
            Ok(_) => {
                if let Some(entry) = self.lock().by_digest.get_mut(digest) {
                    entry.shared = true;
                }
            }
            Err(e) => {
                tracing::warn!(%digest, architecture = %arch, error = %e, "crash watch: could not share what it learned; kept in this replica's memory");
            }
        }
    }

    /// The architectures `digest` does not run on (none past the TTL).
    pub(crate) fn does_not_run_on(&self, digest: &str, now: Instant) -> Vec<String> {
        match self.lock().by_digest.get(digest) {
            Some(entry) if now < entry.expires => entry.archs.clone(),
            _ => Vec::new(),
        }
    }

    /// `review`, `audit`: the shared store read, the first time only (a failure is a warning:
    /// the decisions are made without it). A no-op otherwise.
    pub(crate) async fn ready(&self) {
        let (Some(once), Some(shared)) = (&self.once, &self.shared) else {
            return;
        };
        once.get_or_init(|| async {
            match shared.entries().await {
                Ok(entries) => self.replace_shared(entries, Instant::now()),
                Err(e) => tracing::warn!(error = %e, "could not read what the crash watch learned from the shared cache: decided without it"),
            }
        })
        .await;
    }

    /// `serve` with the shared store: the task keeping memory in step with it.
    pub(crate) fn refresh(&self) -> Option<JoinHandle<()>> {
        let shared = self.shared.clone()?;
        let learned = self.clone();
        Some(tokio::spawn(async move {
            let mut seen: Option<i64> = None;
            let mut up = true;
            let mut tick = tokio::time::interval(REFRESH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let read = match shared.version().await {
                    Ok(version) if seen == Some(version) => Ok(None),
                    Ok(version) => shared.entries().await.map(|e| Some((version, e))),
                    Err(e) => Err(e),
                };
                match read {
                    Ok(read) => {
                        if let Some((version, entries)) = read {
                            learned.replace_shared(entries, Instant::now());
                            seen = Some(version);
                        }
                        up = true;
                    }
                    Err(e) if up => {
                        tracing::warn!(error = %e, "crash watch: could not read what the replicas learned from the shared cache; using this replica's memory until it answers");
                        up = false;
                    }
                    Err(_) => {}
                }
            }
        }))
    }

    /// The shared store's `entries` in place of those read before; what this replica learned
    /// but could not write stays.
    fn replace_shared(&self, entries: Vec<LearnedEntry>, now: Instant) {
        let mut guard = self.lock();
        let map = &mut *guard;
        let gone: Vec<String> = map
            .by_digest
            .iter()
            .filter(|(_, e)| e.shared)
            .map(|(d, _)| d.clone())
            .collect();
        for digest in gone {
            map.remove(&digest);
        }
        map.order.retain(|d| map.by_digest.contains_key(d));
        // Oldest first, as the index is read newest first.
        for entry in entries.into_iter().rev() {
            let expires = now + entry.expires_in;
            for (arch, namespace) in &entry.architectures {
                let kept = map.insert(namespace, &entry.digest, arch, expires);
                kept.shared = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: usize) -> String {
        format!("sha256:{n:064x}")
    }

    #[test]
    fn learned_architectures_expire() {
        let learned = Learned::default();
        let now = Instant::now();
        learned.learn("shop", &digest(1), "arm64", now);
        learned.learn("shop", &digest(1), "arm64", now);
        assert_eq!(learned.does_not_run_on(&digest(1), now), ["arm64"]);
        assert!(learned
            .does_not_run_on(&digest(1), now + LEARNED_TTL)
            .is_empty());
    }

    /// One namespace teaching more than its share forgets its own oldest; the others' stay.
    #[test]
    fn a_namespace_holds_at_most_its_share() {
        let learned = Learned::default();
        let now = Instant::now();
        learned.learn("quiet", &digest(0), "arm64", now);
        for n in 1..=MAX_LEARNED * 2 {
            learned.learn("noisy", &digest(n), "arm64", now);
        }
        assert_eq!(learned.does_not_run_on(&digest(0), now), ["arm64"]);
        let noisy = (1..=MAX_LEARNED * 2)
            .filter(|n| !learned.does_not_run_on(&digest(*n), now).is_empty())
            .count();
        assert_eq!(noisy, MAX_PER_NAMESPACE);
        assert!(learned.does_not_run_on(&digest(1), now).is_empty());
        let last = digest(MAX_LEARNED * 2);
        assert_eq!(learned.does_not_run_on(&last, now), ["arm64"]);
    }

    /// Many namespaces each within their share: the oldest of all is forgotten, in all at most
    /// `MAX_LEARNED`.
    #[test]
    fn in_all_at_most_max_learned() {
        let learned = Learned::default();
        let now = Instant::now();
        for n in 0..MAX_LEARNED + 10 {
            learned.learn(&format!("ns-{}", n % 16), &digest(n), "arm64", now);
        }
        assert_eq!(learned.lock().by_digest.len(), MAX_LEARNED);
        assert!(learned.does_not_run_on(&digest(0), now).is_empty());
        assert!(!learned
            .does_not_run_on(&digest(MAX_LEARNED + 9), now)
            .is_empty());
    }

    /// A refresh drops what the store forgot, keeps what could not be written.
    #[test]
    fn a_refresh_replaces_what_was_shared() {
        let learned = Learned::default();
        let now = Instant::now();
        learned.learn("shop", &digest(1), "arm64", now);
        learned.lock().by_digest.get_mut(&digest(1)).unwrap().shared = true;
        learned.learn("shop", &digest(2), "arm64", now);
        let from_store = LearnedEntry {
            digest: digest(3),
            architectures: vec![("arm".into(), "lab".into())],
            expires_in: Duration::from_secs(60),
        };
        learned.replace_shared(vec![from_store], now);
        assert!(learned.does_not_run_on(&digest(1), now).is_empty());
        assert_eq!(learned.does_not_run_on(&digest(2), now), ["arm64"]);
        assert_eq!(learned.does_not_run_on(&digest(3), now), ["arm"]);
        let later = now + Duration::from_secs(61);
        assert!(learned.does_not_run_on(&digest(3), later).is_empty());
    }
}
