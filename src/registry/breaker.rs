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
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::clock::ManualClock;

    const COOLDOWN: Duration = Duration::from_secs(30);
    const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

    fn breakers(failures: u32) -> (CircuitBreakers, Arc<ManualClock>) {
        let clock = ManualClock::new();
        let settings = BreakerSettings {
            failures,
            cooldown: COOLDOWN,
        };
        (CircuitBreakers::new(settings, clock.clone()), clock)
    }

    fn retry_in(breakers: &CircuitBreakers, host: &str) -> Option<Duration> {
        breakers
            .check(host, PROBE_TIMEOUT)
            .err()
            .map(|open| open.retry_in)
    }

    #[test]
    fn opens_after_the_configured_failures_and_fails_fast_while_open() {
        let (b, clock) = breakers(3);
        assert!(!b.failure("r", "refused", None));
        assert!(!b.failure("r", "refused", None));
        assert!(
            b.check("r", PROBE_TIMEOUT).is_ok(),
            "two failures are not three"
        );
        assert!(b.failure("r", "timed out", None), "the third opens it");
        let open = b.check("r", PROBE_TIMEOUT).expect_err("open");
        assert_eq!(open.retry_in, COOLDOWN);
        assert_eq!(open.cause, "timed out");
        clock.advance(Duration::from_secs(10));
        assert_eq!(retry_in(&b, "r"), Some(Duration::from_secs(20)));
        // Failures while open do not report it opening again.
        assert!(!b.failure("r", "timed out", None));
        // Other hosts are not affected.
        assert!(b.check("other", PROBE_TIMEOUT).is_ok());
    }

    #[test]
    fn half_open_lets_exactly_one_probe_through_after_the_cooldown() {
        let (b, clock) = breakers(1);
        assert!(b.failure("r", "refused", None));
        clock.advance(COOLDOWN - Duration::from_millis(1));
        assert!(b.check("r", PROBE_TIMEOUT).is_err());
        clock.advance(Duration::from_millis(1));
        assert!(b.check("r", PROBE_TIMEOUT).is_ok(), "the probe");
        assert_eq!(
            retry_in(&b, "r"),
            Some(PROBE_TIMEOUT),
            "others still fail fast"
        );
        clock.advance(Duration::from_secs(2));
        assert_eq!(retry_in(&b, "r"), Some(Duration::from_secs(3)));
        // A probe that never answers does not wedge the breaker: another goes after its timeout.
        clock.advance(Duration::from_secs(3));
        assert!(b.check("r", PROBE_TIMEOUT).is_ok(), "a second probe");
        assert!(b.check("r", PROBE_TIMEOUT).is_err());
    }

    #[test]
    fn a_failed_probe_reopens_and_a_success_closes() {
        let (b, clock) = breakers(2);
        b.failure("r", "refused", None);
        assert!(b.failure("r", "refused", None));
        clock.advance(COOLDOWN);
        assert!(b.check("r", PROBE_TIMEOUT).is_ok());
        assert!(
            b.failure("r", "still refused", None),
            "the probe failed: open again"
        );
        let open = b.check("r", PROBE_TIMEOUT).expect_err("open");
        assert_eq!(
            (open.retry_in, open.cause.as_str()),
            (COOLDOWN, "still refused")
        );

        clock.advance(COOLDOWN);
        assert!(b.check("r", PROBE_TIMEOUT).is_ok());
        b.success("r");
        assert!(b.check("r", PROBE_TIMEOUT).is_ok());
        assert!(
            b.check("r", PROBE_TIMEOUT).is_ok(),
            "closed: no probe slot any more"
        );
        // Closed afresh: the count starts over.
        assert!(!b.failure("r", "refused", None));
        assert!(b.check("r", PROBE_TIMEOUT).is_ok());
    }

    #[test]
    fn retry_after_opens_at_once_for_as_long_as_asked_up_to_ten_minutes() {
        let (b, clock) = breakers(0);
        for _ in 0..10 {
            assert!(
                !b.failure("r", "refused", None),
                "0 never opens on failures"
            );
        }
        assert!(b.check("r", PROBE_TIMEOUT).is_ok());
        assert!(b.failure("r", "rate limited", Some(Duration::from_secs(42))));
        assert_eq!(retry_in(&b, "r"), Some(Duration::from_secs(42)));
        clock.advance(Duration::from_secs(42));
        assert!(b.check("r", PROBE_TIMEOUT).is_ok());

        assert!(b.failure("hub", "rate limited", Some(Duration::from_secs(86_400))));
        assert_eq!(retry_in(&b, "hub"), Some(MAX_RETRY_AFTER));
        clock.advance(MAX_RETRY_AFTER);
        assert!(b.check("hub", PROBE_TIMEOUT).is_ok());
    }

    #[test]
    fn remembers_a_bounded_number_of_hosts() {
        let (b, clock) = breakers(1);
        for i in 0..MAX_TRACKED_HOSTS {
            assert!(b.failure(&format!("h{i}"), "refused", None));
        }
        // Every tracked host is open: a new one is not remembered rather than grow the map.
        assert!(!b.failure("new", "refused", None));
        assert!(b.check("new", PROBE_TIMEOUT).is_ok());
        // Once they have cooled down they make room.
        clock.advance(COOLDOWN);
        assert!(b.failure("new", "refused", None));
        assert!(b.check("new", PROBE_TIMEOUT).is_err());
        assert!(b.hosts.lock().unwrap().len() <= MAX_TRACKED_HOSTS);
    }
}
