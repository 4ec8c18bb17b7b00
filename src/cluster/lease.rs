//! Leader election on a `coordination.k8s.io/v1` Lease: which one of tolerable's replicas runs
//! the gate releaser. Every replica keeps serving admissions; only the leader releases gated
//! Pods, so two replicas never patch the same Pod at once.
//!
//! The algorithm is client-go's `leaderelection` with a `LeaseLock`: read the Lease; take it when
//! it does not exist (create), is free (no holder) or has not been renewed for its lease duration
//! as *this* replica observed it (its own clock, so clock skew between nodes does not matter);
//! renew it while holding it. Every write is a create or an update carrying the resourceVersion
//! that was read, so of two replicas racing for the same Lease the API server lets exactly one
//! through (409 for the other). A leader that cannot renew within `renew_deadline` (shorter than
//! the lease duration) stops leading before any other replica may take over. On shutdown the
//! leader stops leading first, then clears the holder so another replica takes over at once
//! instead of after the lease duration. Why not a crate: README, "Dependencies".

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The Lease the gate releasers compete for.
pub const DEFAULT_LEASE_NAME: &str = "tolerable-gates";

/// Where and how to compete. The durations are client-go's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionSettings {
    /// The Lease's name (`tolerable-gates`).
    pub lease_name: String,
    /// tolerable's own namespace (the downward API's `POD_NAMESPACE`).
    pub namespace: String,
    /// This replica, as written in `holderIdentity` (its Pod name and a random suffix): unique
    /// among the replicas.
    pub identity: String,
    /// How long a Lease not renewed stays the holder's (15 s): other replicas wait this long,
    /// as they observed it, before taking over from a leader that died without releasing.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal (10 s): shorter than
    /// `lease_duration`, so it has stopped before anyone else may start.
    pub renew_deadline: Duration,
    /// How often the Lease is renewed by the leader and tried by the others (2 s).
    pub retry_period: Duration,
}

impl LeaderElectionSettings {
    /// client-go's defaults for a replica `identity` in `namespace`.
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The defaults for this replica: namespace `POD_NAMESPACE` (the downward API), else the
    /// client's (in a Pod: its ServiceAccount's, which is tolerable's own); identity `POD_NAME`,
    /// else `HOSTNAME` (the container runtime sets it to the Pod's name), else `tolerable`,
    /// followed by a random suffix, as client-go advises: two processes never share an
    /// identity (a Pod restarted in place, two replicas without either variable), which would
    /// make both believe they hold the Lease.
    pub fn for_replica(client: &kube::Client) -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let pod = var("POD_NAME")
            .or_else(|| var("HOSTNAME"))
            .unwrap_or_else(|| "tolerable".to_owned());
        Self::new(
            var("POD_NAMESPACE").unwrap_or_else(|| client.default_namespace().to_owned()),
            format!("{pod}_{}", random_suffix()),
        )
    }
}

/// 12 random hex digits.
fn random_suffix() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 6];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A running election. [`LeaderElection::leader`] says whether this replica leads now;
/// [`LeaderElection::shutdown`] gives the Lease up. Dropped without `shutdown`, it stops at once
/// without releasing (as a crashed replica would): the others take over after the lease duration.
pub struct LeaderElection {
    leading: Arc<watch::Sender<bool>>,
    gauge: Gauge,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl LeaderElection {
    /// Starts competing for the Lease of `settings` through `client`; `gauge` is 1 while this
    /// replica leads, else 0.
    pub fn start(client: kube::Client, settings: LeaderElectionSettings, gauge: Gauge) -> Self {
        debug_assert!(
            settings.renew_deadline < settings.lease_duration,
            "a leader must stop before another may start"
        );
        let leading = Arc::new(watch::channel(false).0);
        let (stop, stopped) = oneshot::channel();
        let elector = Elector {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
            leading: leading.clone(),
            gauge: gauge.clone(),
            last_error: None,
        };
        let task = tokio::spawn(elector.run(stopped));
        Self {
            leading,
            gauge,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// `true` while this replica leads. The gate releaser runs only while it says so.
    pub fn leader(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Stops leading (the receivers say `false` first), then clears the Lease's holder if this
    /// replica held it, so another replica takes over without waiting for the lease duration.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LeaderElection {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            self.leading.send_replace(false);
            self.gauge.set(0);
        }
    }
}

/// The Lease as last read, and when this replica saw it change: the holder's lease runs from
/// then, on this replica's clock.
struct Observed {
    resource_version: Option<String>,
    at: Instant,
}

/// What one attempt found.
enum Attempt {
    /// This replica holds the Lease, renewed just now.
    Holds,
    /// Another replica holds it and its lease has not run out.
    HeldElsewhere,
}

struct Elector {
    api: Api<Lease>,
    settings: LeaderElectionSettings,
    observed: Option<Observed>,
    leading: Arc<watch::Sender<bool>>,
    gauge: Gauge,
    /// The last failure said at warn level: repeats are said at debug (every retry period).
    last_error: Option<String>,
}

impl Elector {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        // When the last successful renewal was sent: leadership ends `renew_deadline` after it.
        let mut renewed: Option<Instant> = None;
        loop {
            // Past the deadline (woken for it): step down before trying again.
            renewed = renewed.filter(|at| at.elapsed() < self.settings.renew_deadline);
            self.set_leading(renewed.is_some());
            let started = Instant::now();
            // A leader's attempt ends at its deadline: it steps down then, not when a hung
            // request gives up.
            let budget = renewed.map_or(self.settings.renew_deadline, |at| {
                (at + self.settings.renew_deadline).saturating_duration_since(started)
            });
            let attempt = tokio::select! {
                _ = &mut stop => break,
                attempt = tokio::time::timeout(budget, self.try_acquire_or_renew()) => attempt,
            };
            match attempt {
                Ok(Ok(held)) => {
                    self.last_error = None;
                    renewed = matches!(held, Attempt::Holds).then_some(started);
                }
                Ok(Err(e)) => self.failed(&e.to_string()),
                Err(_) => self.failed("the API server did not answer in time"),
            }
            renewed = renewed.filter(|at| at.elapsed() < self.settings.renew_deadline);
            self.set_leading(renewed.is_some());
            // The next attempt after the retry period, or at the deadline if that is sooner.
            let next = Instant::now() + self.settings.retry_period;
            let wake = renewed.map_or(next, |at| next.min(at + self.settings.renew_deadline));
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
        // Stop leading before giving the Lease up: the releaser has stopped before another
        // replica's starts.
        self.set_leading(false);
        self.release().await;
    }

    fn failed(&mut self, why: &str) {
        if self.last_error.as_deref() == Some(why) {
            tracing::debug!(lease = %self.settings.lease_name, error = %why, "leader election: lease not renewed, retrying");
        } else {
            tracing::warn!(lease = %self.settings.lease_name, error = %why, "leader election: cannot read or write the lease; retrying");
            self.last_error = Some(why.to_owned());
        }
    }

    fn set_leading(&mut self, leading: bool) {
        self.gauge.set(i64::from(leading));
        let was = self.leading.send_replace(leading);
        if was != leading {
            let settings = &self.settings;
            if leading {
                tracing::info!(lease = %settings.lease_name, namespace = %settings.namespace, identity = %settings.identity, "leading: this replica releases gated Pods");
            } else {
                tracing::info!(lease = %settings.lease_name, namespace = %settings.namespace, identity = %settings.identity, "no longer leading: another replica releases gated Pods");
            }
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let name = self.settings.lease_name.clone();
        let Some(mut lease) = self.api.get_opt(&name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(taken(None, &self.settings)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(Attempt::Holds)
                }
                Err(e) if is_conflict(&e) => Ok(Attempt::HeldElsewhere),
                Err(e) => Err(e),
            };
        };
        self.observe(&lease);
        let spec = lease.spec.take().unwrap_or_default();
        if self.held_by_another(&spec) {
            return Ok(Attempt::HeldElsewhere);
        }
        lease.spec = Some(taken(Some(spec), &self.settings));
        // The update carries the resourceVersion just read: if anyone wrote in between, 409.
        match self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(replaced) => {
                self.observe(&replaced);
                Ok(Attempt::Holds)
            }
            Err(e) if is_conflict(&e) => Ok(Attempt::HeldElsewhere),
            Err(e) => Err(e),
        }
    }

    /// Notes when the Lease last changed, as this replica saw it.
    fn observe(&mut self, lease: &Lease) {
        let version = lease.metadata.resource_version.clone();
        if self.observed.as_ref().map(|o| &o.resource_version) != Some(&version) {
            self.observed = Some(Observed {
                resource_version: version,
                at: Instant::now(),
            });
        }
    }

    /// Another replica holds the Lease and, as this replica observed it, renewed it within its
    /// lease duration.
    fn held_by_another(&self, spec: &LeaseSpec) -> bool {
        let holder = spec.holder_identity.as_deref().unwrap_or("");
        if holder.is_empty() || holder == self.settings.identity {
            return false;
        }
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.settings.lease_duration, Duration::from_secs);
        self.observed
            .as_ref()
            .is_some_and(|o| o.at.elapsed() < duration)
    }

    /// Clears the holder, if this replica still holds the Lease, with the resourceVersion it
    /// last read (if anyone else wrote since, the Lease is not ours to clear).
    async fn release(&mut self) {
        let name = &self.settings.lease_name;
        let result = async {
            let Some(mut lease) = self.api.get_opt(name).await? else {
                return Ok(false);
            };
            let mut spec = lease.spec.take().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
                return Ok(false);
            }
            spec.holder_identity = None;
            // client-go's release: 0 is invalid, 1 s is "run out already".
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now());
            lease.spec = Some(spec);
            self.api
                .replace(name, &PostParams::default(), &lease)
                .await
                .map(|_| true)
        };
        match tokio::time::timeout(self.settings.renew_deadline, result).await {
            Ok(Ok(true)) => {
                tracing::info!(lease = %name, "released the lease: another replica takes over now")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %name, error = %e, "could not release the lease: another replica takes over when it runs out")
            }
            Err(_) => {
                tracing::warn!(lease = %name, "could not release the lease in time: another replica takes over when it runs out")
            }
        }
    }
}

/// The Lease spec with this replica as holder, renewed now; `current` is what it was (`None`
/// for a new Lease): a change of holder is a transition with a new acquire time.
fn taken(current: Option<LeaseSpec>, settings: &LeaderElectionSettings) -> LeaseSpec {
    let now = now();
    let mut spec = current.unwrap_or_default();
    let ours = spec.holder_identity.as_deref() == Some(settings.identity.as_str());
    if !ours {
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(match spec.holder_identity.as_deref() {
            None | Some("") => spec.lease_transitions.unwrap_or(0),
            Some(_) => spec.lease_transitions.unwrap_or(0).saturating_add(1),
        });
        spec.holder_identity = Some(settings.identity.clone());
    }
    spec.renew_time = Some(now);
    spec.lease_duration_seconds =
        Some(i32::try_from(settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX));
    spec
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// 409: created by someone else first (AlreadyExists), or written since it was read (Conflict).
fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LeaderElectionSettings {
        LeaderElectionSettings::new("tolerable", "tolerable-a")
    }

    #[test]
    fn each_process_has_an_identity_of_its_own() {
        let (a, b) = (random_suffix(), random_suffix());
        assert_eq!(a.len(), 12);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn the_defaults_are_client_gos() {
        let s = settings();
        assert_eq!(s.lease_name, "tolerable-gates");
        assert_eq!(s.lease_duration, Duration::from_secs(15));
        assert_eq!(s.renew_deadline, Duration::from_secs(10));
        assert_eq!(s.retry_period, Duration::from_secs(2));
        assert!(s.renew_deadline < s.lease_duration);
    }

    #[test]
    fn taking_a_lease_from_another_holder_is_a_transition() {
        let before = LeaseSpec {
            holder_identity: Some("tolerable-b".into()),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        };
        let spec = taken(Some(before), &settings());
        assert_eq!(spec.holder_identity.as_deref(), Some("tolerable-a"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());
    }

    #[test]
    fn renewing_keeps_the_acquire_time_and_the_transitions() {
        let acquired = MicroTime("2026-11-24T10:00:00Z".parse().unwrap());
        let before = LeaseSpec {
            holder_identity: Some("tolerable-a".into()),
            acquire_time: Some(acquired.clone()),
            lease_transitions: Some(2),
            ..LeaseSpec::default()
        };
        let spec = taken(Some(before), &settings());
        assert_eq!(spec.acquire_time, Some(acquired));
        assert_eq!(spec.lease_transitions, Some(2));
    }

    #[test]
    fn taking_a_released_lease_is_not_counted_twice() {
        let spec = taken(
            Some(LeaseSpec {
                lease_transitions: Some(5),
                ..LeaseSpec::default()
            }),
            &settings(),
        );
        assert_eq!(spec.lease_transitions, Some(5));
        assert_eq!(taken(None, &settings()).lease_transitions, Some(0));
    }
}
