//! Per-host circuit breakers: a registry that keeps failing (or asks to back off) is left alone
//! for a while instead of being hammered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::clock::Clock;
use super::MAX_TRACKED_HOSTS;

/// When to stop asking a registry host.
#[derive(Clone, Debug)]
pub struct BreakerSettings {
    /// Consecutive "unavailable" failures (connect errors, timeouts, 5xx, 429) that open the
    /// circuit; 0 never opens it (a 429's `Retry-After` is honoured regardless).
    pub failures: u32,
    /// How long an open circuit stays open before the registry is tried again.
    pub cooldown: Duration,
}

/// A `Retry-After` longer than this is not believed (a misconfigured registry must not switch
/// lookups off for a day).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Per-host circuit breakers. Closed: requests flow, unavailable failures are counted. Open:
/// lookups fail at once (the cache serves last known answers meanwhile). Half-open, after the
/// cooldown: one lookup goes through as a probe while the others still fail fast; its failure
/// re-opens the circuit, its success closes it.
pub(super) struct CircuitBreakers {
    settings: BreakerSettings,
    clock: Arc<dyn Clock>,
    hosts: Mutex<HashMap<String, HostHealth>>,
}

#[derive(Default)]
struct HostHealth {
    consecutive_failures: u32,
    open_until: Option<Instant>,
    cause: String,
    /// Half-open: when the one request let through after the cooldown went out.
    probe_since: Option<Instant>,
}

pub(super) struct Open {
    pub(super) retry_in: Duration,
    pub(super) cause: String,
}

impl CircuitBreakers {
    pub(super) fn new(settings: BreakerSettings, clock: Arc<dyn Clock>) -> Self {
        Self {
            settings,
            clock,
            hosts: Mutex::default(),
        }
    }

    /// Whether a request may go to `host` now. After the cooldown exactly one request (the
    /// probe) goes; the others keep failing fast until it answers, or until `probe_timeout`
    /// has passed without an answer (a probe abandoned by its caller must not wedge the breaker).
    pub(super) fn check(&self, host: &str, probe_timeout: Duration) -> Result<(), Open> {
        let mut hosts = self.hosts.lock().expect("breaker lock poisoned");
        let Some(health) = hosts.get_mut(host) else {
            return Ok(());
        };
        let Some(until) = health.open_until else {
            return Ok(());
        };
        let now = self.clock.now();
        if let Some(retry_in) = until.checked_duration_since(now).filter(|d| !d.is_zero()) {
            return Err(Open {
                retry_in,
                cause: health.cause.clone(),
            });
        }
        match health.probe_since {
            Some(since) if now.duration_since(since) < probe_timeout => Err(Open {
                retry_in: probe_timeout.saturating_sub(now.duration_since(since)),
                cause: health.cause.clone(),
            }),
            _ => {
                health.probe_since = Some(now);
                Ok(())
            }
        }
    }

    pub(super) fn success(&self, host: &str) {
        let mut hosts = self.hosts.lock().expect("breaker lock poisoned");
        if hosts.remove(host).is_some_and(|h| h.open_until.is_some()) {
            tracing::info!(registry = ?host, "registry answers again: circuit closed");
        }
    }

    /// Counts a failure; true when this opened the circuit.
    pub(super) fn failure(&self, host: &str, cause: &str, retry_after: Option<Duration>) -> bool {
        let now = self.clock.now();
        let mut hosts = self.hosts.lock().expect("breaker lock poisoned");
        if hosts.len() >= MAX_TRACKED_HOSTS && !hosts.contains_key(host) {
            hosts.retain(|_, h| h.open_until.is_some_and(|until| until > now));
            if hosts.len() >= MAX_TRACKED_HOSTS {
                return false;
            }
        }
        let health = hosts.entry(host.to_owned()).or_default();
        health.consecutive_failures = health.consecutive_failures.saturating_add(1);
        health.cause = cause.to_owned();
        let open_for = match retry_after {
            Some(after) => Some(after.min(MAX_RETRY_AFTER)),
            None if self.settings.failures > 0
                && health.consecutive_failures >= self.settings.failures =>
            {
                Some(self.settings.cooldown)
            }
            None => None,
        };
        let Some(open_for) = open_for else {
            return false;
        };
        let was_open = health.open_until.is_some_and(|until| until > now);
        health.open_until = Some(now + open_for);
        health.probe_since = None;
        !was_open
    }
}
