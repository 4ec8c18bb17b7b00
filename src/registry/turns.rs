//! Turns for registry lookups, so a Pod naming thousands of images cannot open thousands of
//! connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{MAX_LOOKUPS_IN_FLIGHT, MAX_LOOKUPS_PER_HOST, MAX_TRACKED_HOSTS};

/// Turns for registry lookups: at most [`MAX_LOOKUPS_IN_FLIGHT`] at once, and
/// [`MAX_LOOKUPS_PER_HOST`] per registry host. Waiters are served first come, first served.
pub(super) struct LookupTurns {
    all: Arc<Semaphore>,
    hosts: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Default for LookupTurns {
    fn default() -> Self {
        Self {
            all: Arc::new(Semaphore::new(MAX_LOOKUPS_IN_FLIGHT)),
            hosts: Mutex::default(),
        }
    }
}

/// A lookup's turn: both permits, given back when it ends.
pub(super) struct Turn {
    _host: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
}

impl LookupTurns {
    pub(super) async fn take(&self, host: &str) -> Turn {
        let per_host = {
            let mut hosts = self.hosts.lock().expect("turns lock poisoned");
            // Images can name any host: forget the idle ones rather than grow.
            if hosts.len() >= MAX_TRACKED_HOSTS && !hosts.contains_key(host) {
                hosts.retain(|_, s| s.available_permits() < MAX_LOOKUPS_PER_HOST);
            }
            hosts
                .entry(host.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(MAX_LOOKUPS_PER_HOST)))
                .clone()
        };
        // Host first: a queue for one busy registry does not hold turns others could use.
        let host_permit = per_host
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let all_permit = self
            .all
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        Turn {
            _host: host_permit,
            _all: all_permit,
        }
    }
}
