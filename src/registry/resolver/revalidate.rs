//! A tag's answer revalidated with a HEAD: the same digest keeps it, a digest whose answer is
//! known (here or in the shared cache) gives that one, and only a new digest is fetched — by
//! one replica, when a shared cache says another is fetching it.

use std::sync::Arc;

use super::{Asked, Resolver};
use crate::registry::client::HostSource;
use crate::registry::walk::{walk, Walked};
use crate::registry::{FetchError, ImagePlatforms, Revalidation, MAX_TRACKED_HOSTS};

/// What one host answered for one credential.
pub(super) enum Fetched {
    Walked(Walked),
    /// An answer already known: the tag's last one (same digest), or its new digest's.
    Known(Arc<ImagePlatforms>),
}

impl Resolver {
    /// The image's platforms from one host with one credential. A tag with a last answer is
    /// revalidated with a HEAD (and, with a shared cache, any tag is asked for its digest
    /// first): the same digest keeps the answer, a digest whose answer is known (here or in the
    /// shared cache) gives that one, and only a new digest is fetched (by digest, so the answer
    /// is the one the HEAD named). Anything else — a digest reference, a tag seen for the first
    /// time without a shared cache, a host that names no digest on HEAD — walks the manifest
    /// tree.
    pub(super) async fn fetch(
        &self,
        source: &HostSource<'_>,
        asked: &Asked,
        host: &str,
        last: Option<&Arc<ImagePlatforms>>,
    ) -> Result<Fetched, FetchError> {
        let repository = asked.reference.repository();
        let reference = asked.reference.manifest_reference();
        let head_first = !asked.reference.is_immutable()
            && (last.is_some() || asked.shared_keys.is_some())
            && self.names_digests_on_head(host);
        if !head_first {
            return Ok(Fetched::Walked(
                walk(source, repository, reference, &asked.bounds).await?,
            ));
        }
        let named = match source.head_digest(repository, reference).await {
            // A registry that does not do HEAD (405, 501…) is treated as one naming no digest.
            Err(FetchError::Status { code, .. }) if code != 429 && code != 503 => None,
            named => named?,
        };
        let (outcome, fetched) = match (named, last) {
            (Some(digest), Some(last)) if digest == last.digest => {
                (Revalidation::Unchanged, Fetched::Known(last.clone()))
            }
            (Some(digest), _) => match self.known_answer(asked, &digest).await {
                Some(found) => (Revalidation::KnownDigest, Fetched::Known(found)),
                None => match self.fetched_elsewhere(asked, &digest).await {
                    Some(found) => (Revalidation::KnownDigest, Fetched::Known(found)),
                    None => {
                        let walked = walk(source, repository, &digest, &asked.bounds).await?;
                        (Revalidation::Changed, Fetched::Walked(walked))
                    }
                },
            },
            (None, _) => {
                self.remember_no_head_digest(host);
                let walked = walk(source, repository, reference, &asked.bounds).await?;
                (Revalidation::NoDigest, Fetched::Walked(walked))
            }
        };
        if let Some(observer) = self.observer.as_ref().filter(|_| last.is_some()) {
            observer.revalidated(outcome);
        }
        Ok(fetched)
    }

    /// With a shared cache, one replica fetches a digest new to all: it claims the fetch, and
    /// the others wait for its answer (`budget::shared_fetch_wait` at most, then fetch it
    /// themselves). `None`: this replica is to fetch it.
    pub(super) async fn fetched_elsewhere(
        &self,
        asked: &Asked,
        digest: &str,
    ) -> Option<Arc<ImagePlatforms>> {
        let (shared, keys) = self.shared.as_ref().zip(asked.shared_keys.as_ref())?;
        let timeout = self.settings.lookup_timeout;
        let share = crate::budget::shared_cache_share(timeout);
        if shared.claim(keys, digest, timeout, share).await {
            return None;
        }
        let wait = crate::budget::shared_fetch_wait(timeout);
        let found = Arc::new(shared.wait_for(keys, digest, wait, share).await?);
        self.cache
            .remember(asked.digest_key(digest), found.clone())
            .await;
        Some(found)
    }

    /// The answer for `digest` of the asked repository, from the in-memory cache or else the
    /// shared one (then kept in memory too).
    pub(super) async fn known_answer(
        &self,
        asked: &Asked,
        digest: &str,
    ) -> Option<Arc<ImagePlatforms>> {
        let key = asked.digest_key(digest);
        if let Some(found) = self.cache.known(&key).await {
            return Some(found);
        }
        let (shared, keys) = self.shared.as_ref().zip(asked.shared_keys.as_ref())?;
        let share = crate::budget::shared_cache_share(self.settings.lookup_timeout);
        let found = Arc::new(shared.get_digest(keys, digest, share).await?);
        self.cache.remember(key, found.clone()).await;
        Some(found)
    }

    pub(super) fn names_digests_on_head(&self, host: &str) -> bool {
        !self
            .no_head_digest
            .lock()
            .expect("not poisoned")
            .contains(host)
    }

    /// `host` sent no digest on a HEAD: its tags are revalidated with a GET from now on.
    pub(super) fn remember_no_head_digest(&self, host: &str) {
        let mut hosts = self.no_head_digest.lock().expect("not poisoned");
        if hosts.len() < MAX_TRACKED_HOSTS && hosts.insert(host.to_owned()) {
            tracing::info!(registry = ?host, "registry names no Docker-Content-Digest on HEAD: its tags are revalidated with a GET");
        }
    }
}
