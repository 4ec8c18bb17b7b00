//! The one list-and-watch primitive every watch of `serve` is a configuration of: kube-runtime's
//! watcher (a paged list, then a watch; re-lists and backs off on errors) taken into a keyed
//! store of projections, and the state every watch reports, written once:
//!
//! - [`Keyed`]: each object read by a projection (`None`: not kept, so the store is sized by
//!   what is read, not by the cluster) under its key; a re-list gathered aside and swapped in
//!   whole when it is done (the old view serves until then); an event that changes nothing kept
//!   (a kubelet heartbeat) reported as such, so nothing is rebuilt for it.
//! - [`WatchStatus`]: settled (the first list is in, or the API server refused it — readiness
//!   waits for this, never for a refused watch), available (read now), refusals (403s, said
//!   once per refusal rather than once per retry), in sync and until when (the sync metric),
//!   and the count of changes published.
//!
//! The node watch (`nodes.rs`: Node facts, pools rebuilt coalesced) and the namespace watch
//! (`namespaces.rs`: each Namespace's policy) are configurations of it; a new watch is one more
//! projection and what it publishes.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use kube::runtime::watcher;

/// `kube::Resource` for a projection of a core (v1) API object — the few fields a watch keeps,
/// read as kube reads the object: its kind, plural, scope and the field holding its metadata.
/// One place for what each watch's projection would otherwise write out again.
macro_rules! core_v1_projection {
    ($projection:ty, $kind:literal, $plural:literal, $scope:ty, $meta:tt) => {
        impl kube::Resource for $projection {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                "".into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                "v1".into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.$meta
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.$meta
            }
        }
    };
}
pub(crate) use core_v1_projection;

/// Objects of one kind as their projections, by key.
pub(crate) struct Keyed<V> {
    current: HashMap<Arc<str>, Arc<V>>,
    /// A (re-)list in progress: what it has listed so far.
    listing: Option<HashMap<Arc<str>, Arc<V>>>,
}

/// What one watch event did to a [`Keyed`] store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Took {
    /// Part of a (re-)list, not done yet: the view is still the old one.
    Listing,
    /// A full list is in; `changed` names each key added or changed by it, and `removed`
    /// whether any key is gone.
    Listed {
        changed: Vec<Arc<str>>,
        removed: bool,
    },
    /// One key was added, changed or removed.
    Changed(Arc<str>),
    /// Nothing kept changed.
    Unchanged,
}

impl Took {
    /// Whether the view changed.
    pub(crate) fn changed(&self) -> bool {
        match self {
            Self::Listing | Self::Unchanged => false,
            Self::Listed { changed, removed } => *removed || !changed.is_empty(),
            Self::Changed(_) => true,
        }
    }
}

impl<V: PartialEq> Keyed<V> {
    pub(crate) fn new() -> Self {
        Self {
            current: HashMap::new(),
            listing: None,
        }
    }

    /// The view now (the last full list and every change since).
    pub(crate) fn current(&self) -> &HashMap<Arc<str>, Arc<V>> {
        &self.current
    }

    /// Takes one event in: `read` gives an object's key and its projection (`None`: nothing to
    /// keep of it, as if it were gone).
    pub(crate) fn take<K>(
        &mut self,
        event: watcher::Event<K>,
        read: impl Fn(K) -> (Arc<str>, Option<V>),
    ) -> Took {
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                Took::Listing
            }
            watcher::Event::InitApply(object) => {
                if let (key, Some(value)) = read(object) {
                    let listing = self.listing.get_or_insert_with(HashMap::new);
                    listing.insert(key, Arc::new(value));
                }
                Took::Listing
            }
            watcher::Event::InitDone => self.listed(),
            watcher::Event::Apply(object) => {
                let (key, value) = read(object);
                self.set(key, value)
            }
            watcher::Event::Delete(object) => self.set(read(object).0, None),
        }
    }

    /// Sets one key's projection (`None`: removes it), as a watch event would.
    pub(crate) fn set(&mut self, key: Arc<str>, value: Option<V>) -> Took {
        match value {
            Some(value) if self.current.get(&key).map(|v| &**v) != Some(&value) => {
                self.current.insert(key.clone(), Arc::new(value));
                Took::Changed(key)
            }
            None if self.current.remove(&key).is_some() => Took::Changed(key),
            _ => Took::Unchanged,
        }
    }

    fn listed(&mut self) -> Took {
        let mut listed = self.listing.take().unwrap_or_default();
        listed.shrink_to_fit();
        let changed = changed_keys(&self.current, &listed);
        let removed = self.current.keys().any(|key| !listed.contains_key(key));
        self.current = listed;
        Took::Listed { changed, removed }
    }
}

/// The keys of `new` whose value is not the same in `old`.
fn changed_keys<K: Eq + Hash + Clone, V: PartialEq>(
    old: &HashMap<K, Arc<V>>,
    new: &HashMap<K, Arc<V>>,
) -> Vec<K> {
    new.iter()
        .filter(|(key, value)| old.get(*key) != Some(*value))
        .map(|(key, _)| key.clone())
        .collect()
}

/// Whether a watch error is the API server refusing access (403): the watch keeps retrying, but
/// decisions go on without it and it is said once.
pub(crate) fn is_forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 403,
        watcher::Error::WatchError(status) => status.code == 403,
        _ => false,
    }
}

/// What kind of event came from the watcher, read before the event is taken in (so the view can
/// be published before the status that goes with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A (re-)list starts or goes on.
    Listing,
    /// A full list is in.
    Listed,
    /// An object was added, changed or deleted after the list.
    Object,
    /// The API server refused the list or watch (403).
    Refused,
    /// Any other failure: the watcher backs off and lists again.
    Failed,
}

impl Seen {
    pub(crate) fn of<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> Self {
        match event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Self::Listing,
            Ok(watcher::Event::InitDone) => Self::Listed,
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => Self::Object,
            Err(e) if is_forbidden(e) => Self::Refused,
            Err(_) => Self::Failed,
        }
    }
}

/// What an event means for what the watch says (its log lines): a refusal is said once, not
/// once per retry, and its end once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Refused (403), the first time since the start or the last list: say so.
    FirstRefusal,
    /// Refused again (a retry): said already.
    RefusedAgain,
    /// A full list came in after a refusal: say access is back.
    AvailableAgain,
    /// Nothing to say (another event, or another error, which the watch says as it likes).
    Nothing,
}

/// The state every watch reports, shared between its task and its readers.
pub(crate) struct WatchStatus {
    /// Set once the first list is in, or the API server refused it.
    settled: tokio::sync::watch::Sender<bool>,
    /// Read now: `false` before the first list and while refused.
    available: AtomicBool,
    /// Lists or watches the API server refused (403).
    refusals: AtomicU64,
    /// Times what the watch publishes changed.
    updates: AtomicU64,
    /// A refusal said and not yet followed by a list.
    refused: AtomicBool,
    sync: Mutex<SyncState>,
}

impl WatchStatus {
    /// A status; `settled`: there is nothing to wait for (a fixed view).
    pub(crate) fn new(settled: bool) -> Self {
        Self {
            settled: tokio::sync::watch::channel(settled).0,
            available: AtomicBool::new(settled),
            refusals: AtomicU64::new(0),
            updates: AtomicU64::new(0),
            refused: AtomicBool::new(false),
            sync: Mutex::new(SyncState::default()),
        }
    }

    /// An event of the watch came in (after the view took it in).
    pub(crate) fn event(&self, seen: Seen) -> Notice {
        self.sync
            .lock()
            // Plain data: still consistent if a holder panicked.
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .event(seen, SystemTime::now());
        match seen {
            Seen::Listed => {
                self.available.store(true, Ordering::Relaxed);
                self.settled.send_replace(true);
                if self.refused.swap(false, Ordering::Relaxed) {
                    Notice::AvailableAgain
                } else {
                    Notice::Nothing
                }
            }
            Seen::Refused => {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                self.available.store(false, Ordering::Relaxed);
                self.settled.send_replace(true);
                if self.refused.swap(true, Ordering::Relaxed) {
                    Notice::RefusedAgain
                } else {
                    Notice::FirstRefusal
                }
            }
            Seen::Listing | Seen::Object | Seen::Failed => Notice::Nothing,
        }
    }

    /// What the watch publishes changed.
    pub(crate) fn updated(&self) {
        self.updates.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn is_settled(&self) -> bool {
        *self.settled.borrow()
    }

    /// Waits until [`WatchStatus::is_settled`].
    pub(crate) async fn settled(&self) {
        // An error means the sender is gone, and with it any hope of a list.
        let _ = self.settled.subscribe().wait_for(|s| *s).await;
    }

    pub(crate) fn is_available(&self) -> bool {
        self.available.load(Ordering::Relaxed)
    }

    pub(crate) fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    pub(crate) fn updates(&self) -> u64 {
        self.updates.load(Ordering::Relaxed)
    }

    /// Until when the view was known in sync with the API server: now while it is (a full
    /// list arrived and no error since), the moment it failed while it is not, `None` before
    /// the first full list.
    pub(crate) fn last_synced(&self) -> Option<SystemTime> {
        self.sync
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .last_synced(SystemTime::now())
    }
}

/// Whether a watch is in sync: after a full list and while no error has been reported since
/// (kube-runtime's watcher reports every failed watch or list, and lists again).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct SyncState {
    /// In sync now.
    in_sync: bool,
    /// When it last stopped being in sync; `None` before the first full list.
    until: Option<SystemTime>,
    /// A full list has arrived.
    listed: bool,
}

impl SyncState {
    /// An event from the watch, at `now`.
    pub(crate) fn event(&mut self, seen: Seen, now: SystemTime) {
        match seen {
            Seen::Listed => {
                self.listed = true;
                self.in_sync = true;
            }
            // A re-list in progress: the view is the old one until it is done.
            Seen::Listing => {}
            Seen::Object => self.in_sync = self.listed,
            Seen::Refused | Seen::Failed => {
                if self.in_sync {
                    self.until = Some(now);
                }
                self.in_sync = false;
            }
        }
    }

    /// Until when the view was known in sync: `now` while it is.
    pub(crate) fn last_synced(&self, now: SystemTime) -> Option<SystemTime> {
        if self.in_sync {
            Some(now)
        } else {
            self.until
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    /// Objects in these tests: a name and a value; a value of 0 is nothing to keep.
    fn read((name, value): (&str, u32)) -> (Arc<str>, Option<u32>) {
        (Arc::from(name), (value != 0).then_some(value))
    }

    fn listed(store: &mut Keyed<u32>, objects: &[(&'static str, u32)]) -> Took {
        assert_eq!(store.take(Event::Init, read), Took::Listing);
        for object in objects {
            assert_eq!(store.take(Event::InitApply(*object), read), Took::Listing);
        }
        store.take(Event::InitDone, read)
    }

    fn values(store: &Keyed<u32>) -> Vec<(String, u32)> {
        let mut v: Vec<_> = store
            .current()
            .iter()
            .map(|(k, v)| (k.to_string(), **v))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_list_is_swapped_in_whole_when_done_keeping_only_what_is_read() {
        let mut store = Keyed::new();
        listed(&mut store, &[("a", 1), ("b", 0)]);
        assert_eq!(values(&store), [("a".into(), 1)]);
        // A re-list in progress: the old view serves until it is done.
        store.take(Event::Init, read);
        store.take(Event::InitApply(("c", 3)), read);
        assert_eq!(values(&store), [("a".into(), 1)]);
        let took = store.take(Event::InitDone, read);
        assert_eq!(
            took,
            Took::Listed {
                changed: vec![Arc::from("c")],
                removed: true
            }
        );
        assert_eq!(values(&store), [("c".into(), 3)]);
    }

    #[test]
    fn a_relist_of_the_same_objects_changes_nothing() {
        let mut store = Keyed::new();
        listed(&mut store, &[("a", 1), ("b", 2)]);
        let again = listed(&mut store, &[("b", 2), ("a", 1)]);
        assert!(!again.changed(), "{again:?}");
    }

    #[test]
    fn an_event_that_changes_nothing_kept_is_unchanged() {
        let mut store = Keyed::new();
        listed(&mut store, &[("a", 1)]);
        assert_eq!(store.take(Event::Apply(("a", 1)), read), Took::Unchanged);
        assert_eq!(store.take(Event::Apply(("z", 0)), read), Took::Unchanged);
        assert_eq!(store.take(Event::Delete(("z", 0)), read), Took::Unchanged);
        assert_eq!(
            store.take(Event::Apply(("a", 2)), read),
            Took::Changed(Arc::from("a"))
        );
        // Now saying nothing kept: as if gone.
        assert_eq!(
            store.take(Event::Apply(("a", 0)), read),
            Took::Changed(Arc::from("a"))
        );
        assert_eq!(values(&store), []);
    }

    fn forbidden() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure("namespaces is forbidden", "Forbidden").with_code(403),
        )))
    }

    #[test]
    fn a_refusal_settles_once_said_and_a_list_makes_it_available_again() {
        let status = WatchStatus::new(false);
        assert!(!status.is_settled() && !status.is_available());
        let refused = Seen::of::<()>(&Err(forbidden()));
        assert_eq!(refused, Seen::Refused);
        assert_eq!(status.event(refused), Notice::FirstRefusal);
        assert_eq!(status.event(refused), Notice::RefusedAgain);
        assert!(status.is_settled() && !status.is_available());
        assert_eq!(status.refusals(), 2);
        assert_eq!(
            status.event(Seen::of(&Ok(Event::<()>::Init))),
            Notice::Nothing
        );
        let listed = Seen::of(&Ok(Event::<()>::InitDone));
        assert_eq!(status.event(listed), Notice::AvailableAgain);
        assert!(status.is_available());
        assert_eq!(status.event(listed), Notice::Nothing);
        // Refused again later: said again.
        assert_eq!(status.event(refused), Notice::FirstRefusal);
        let failed = Seen::of::<()>(&Err(watcher::Error::NoResourceVersion));
        assert_eq!(failed, Seen::Failed);
    }

    #[test]
    fn in_sync_after_a_full_list_until_an_error_then_again_after_the_next_event() {
        let t = |s| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s);
        let mut sync = SyncState::default();
        assert_eq!(sync.last_synced(t(1)), None, "before the first list");
        sync.event(Seen::Listing, t(1));
        assert_eq!(sync.last_synced(t(2)), None, "the list is not done");
        sync.event(Seen::Object, t(2));
        assert_eq!(sync.last_synced(t(2)), None, "an object is no list");
        sync.event(Seen::Listed, t(3));
        assert_eq!(sync.last_synced(t(100)), Some(t(100)), "in sync: now");
        sync.event(Seen::Failed, t(200));
        assert_eq!(sync.last_synced(t(900)), Some(t(200)), "since the failure");
        sync.event(Seen::Refused, t(300));
        assert_eq!(
            sync.last_synced(t(900)),
            Some(t(200)),
            "the first failure counts"
        );
        // The watcher re-lists: not in sync until the list is done.
        sync.event(Seen::Listing, t(400));
        assert_eq!(sync.last_synced(t(900)), Some(t(200)));
        sync.event(Seen::Listed, t(500));
        assert_eq!(sync.last_synced(t(901)), Some(t(901)));
        // Or the watch resumes without a list: its next event says so.
        sync.event(Seen::Failed, t(1000));
        sync.event(Seen::Object, t(1010));
        assert_eq!(sync.last_synced(t(1020)), Some(t(1020)));
    }
}
