//! The time budget of one admission, every share of it in one place. The API server waits
//! `?timeout=` for an answer (10 s unless the webhook configuration says otherwise) and then
//! applies the failure policy; tolerable answers well before, whatever its registries do:
//!
//! ```text
//! ?timeout= ───────────────────────────────────────────────────────────────┐
//! │ lookups: the budget = timeout − margin (a fifth, ≥ 300 ms)  │ margin    │
//! │ ├ pull secrets: at most a third of the budget                          │
//! │ └ each lookup ends itself a twentieth before the budget ends (and is   │
//! │   then counted by the circuit breaker); the shared cache gets a tenth  │
//! │   of a lookup's time (≤ 250 ms) per read or write, and a replica waits │
//! │   a quarter of it for another one fetching the same digest; a mirror   │
//! │   gets half of what is left, so a hung mirror leaves time for the      │
//! │   origin; a credential plugin half of what is left, then it is killed; │
//! │   a lookup left less than half its time after waiting for its turn is  │
//! │   throttled (tolerable's limit), not a registry timeout                │
//! ```

use std::time::Duration;

/// What the API server waits when the request names no `?timeout=` (its own default).
pub(crate) const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(10);
/// The least time kept back from the API server's timeout to encode and send the answer.
/// One look of the gate controller at a gated Pod's images (pull secrets and lookups): as long
/// as the API server gives an admission by default, so a release decides within what an
/// admission could have waited.
pub(crate) const GATE_LOOKUP: Duration = DEFAULT_API_TIMEOUT;
pub(crate) const MIN_MARGIN: Duration = Duration::from_millis(300);
/// The least budget given, however short the API server's timeout.
const MIN_BUDGET: Duration = Duration::from_millis(50);
/// `tolerable review` has no API server waiting: its budget is `lookup_timeout` and this.
const REVIEW_SLACK: Duration = Duration::from_millis(500);

/// The budget for an admission's lookups: the API server's `?timeout=` (given as the request's
/// query string) minus a margin (a fifth, at least [`MIN_MARGIN`]), so the answer arrives
/// before the API server gives up.
pub fn for_query(query: Option<&str>) -> Duration {
    let timeout = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("timeout="))
        .and_then(|value| crate::duration::parse_go(value).ok())
        .filter(|t| !t.is_zero())
        .unwrap_or(DEFAULT_API_TIMEOUT);
    let margin = (timeout / 5).max(MIN_MARGIN);
    timeout.saturating_sub(margin).max(MIN_BUDGET)
}

/// The budget of `tolerable review`: every lookup may take its whole `lookup_timeout`.
pub(crate) fn for_review(lookup_timeout: Duration) -> Duration {
    lookup_timeout + REVIEW_SLACK
}

/// The most the pull-secret reads may take: the API server usually answers from the cache; when
/// it is slow, the registry lookups still get their time.
pub(crate) fn for_pull_secrets(budget: Duration) -> Duration {
    budget / 3
}

/// How long before the admission's deadline a registry lookup ends itself, so it is counted by
/// the circuit breaker rather than cut off from outside.
pub(crate) fn lookup_margin(budget: Duration) -> Duration {
    budget / 20
}

/// The most one request to the shared cache may take.
const MAX_SHARED_CACHE_WAIT: Duration = Duration::from_millis(250);

/// The shared cache's share of a lookup that may take `timeout`, per request (a read before the
/// registry, a write after it): a tenth, at most [`MAX_SHARED_CACHE_WAIT`]. A cache slower than
/// that is treated as down, and the in-memory cache and the registry answer alone.
pub(crate) fn shared_cache_share(timeout: Duration) -> Duration {
    (timeout / 10).min(MAX_SHARED_CACHE_WAIT)
}

/// How long a replica waits for another to fetch a digest new to both (the shared cache's
/// single flight): a quarter of the lookup's time; then it fetches the digest itself.
pub(crate) fn shared_fetch_wait(timeout: Duration) -> Duration {
    timeout / 4
}

/// A mirror's share of what is left: a hung mirror leaves the origin the other half.
pub(crate) fn mirror_share(left: Duration) -> Duration {
    left / 2
}

/// `inspect --verify`, `audit --verify`: a child manifest and a config blob per claimed
/// platform, more than one lookup asks: three lookups' time.
pub(crate) fn for_verify(lookup_timeout: Duration) -> Duration {
    lookup_timeout * 3
}

/// Whether a lookup cut off by its deadline gave its registry a fair chance: at least half its
/// `timeout` after its turn came. One that waited longer for its turn behind other lookups was
/// cut short by tolerable's own limit (throttled), not by the registry (a timeout its circuit
/// breaker counts).
pub(crate) fn registry_had_its_chance(time_after_turn: Duration, timeout: Duration) -> bool {
    time_after_turn >= timeout / 2
}

/// A credential plugin's share of what is left of a lookup: it is killed then, and the
/// registry (with the plugin's credentials, or the next source's) still gets the other half.
pub(crate) fn credential_plugin_share(left: Duration) -> Duration {
    left / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_from_the_api_servers_timeout() {
        assert_eq!(for_query(Some("timeout=10s")), Duration::from_secs(8));
        assert_eq!(for_query(Some("x=1&timeout=30s")), Duration::from_secs(24));
        assert_eq!(for_query(Some("timeout=1s")), Duration::from_millis(700));
        assert_eq!(for_query(None), Duration::from_secs(8));
        assert_eq!(for_query(Some("timeout=bogus")), Duration::from_secs(8));
        assert_eq!(for_query(Some("timeout=100ms")), Duration::from_millis(50));
    }

    #[test]
    fn shares_of_a_budget() {
        let budget = Duration::from_secs(6);
        assert_eq!(for_pull_secrets(budget), Duration::from_secs(2));
        assert_eq!(lookup_margin(budget), Duration::from_millis(300));
        assert_eq!(mirror_share(budget), Duration::from_secs(3));
        assert_eq!(shared_cache_share(budget), Duration::from_millis(250));
        assert_eq!(shared_fetch_wait(budget), Duration::from_millis(1500));
        assert_eq!(
            shared_cache_share(Duration::from_secs(1)),
            Duration::from_millis(100)
        );
        assert_eq!(credential_plugin_share(budget), Duration::from_secs(3));
        assert_eq!(for_verify(Duration::from_secs(4)), Duration::from_secs(12));
        assert!(registry_had_its_chance(Duration::from_secs(3), budget));
        assert!(!registry_had_its_chance(
            Duration::from_millis(2999),
            budget
        ));
        assert_eq!(
            for_review(Duration::from_secs(5)),
            Duration::from_millis(5500)
        );
    }
}
