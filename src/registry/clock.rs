//! The time tolerable's own decisions read: when a circuit half-opens, when a cached answer stops
//! being fresh, how old a stale answer is. Injected, so tests move time by hand instead of
//! sleeping. Lookup deadlines stay on tokio's clock, which tokio's timers need.

use std::time::Instant;

/// Where "now" comes from.
pub(crate) trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The real clock.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until a test advances it.
#[cfg(test)]
pub(crate) struct ManualClock {
    now: std::sync::Mutex<Instant>,
}

#[cfg(test)]
impl ManualClock {
    pub(crate) fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            now: std::sync::Mutex::new(Instant::now()),
        })
    }

    pub(crate) fn advance(&self, by: std::time::Duration) {
        *self.now.lock().expect("clock lock poisoned") += by;
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock().expect("clock lock poisoned")
    }
}
