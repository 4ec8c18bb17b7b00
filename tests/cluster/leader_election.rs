//! Exactly one gate releaser: the leader election (`tolerable::cluster::lease`) against a fake
//! API server's Leases (`tests/common/lease_api.rs`) that refuses what the real one refuses.
//! Each test records every leadership transition every replica reports and checks them against
//! the fake's log of every accepted write to the Lease: the holders those writes name never
//! overlap, and each replica led only inside its own holding (`Transitions::never_two`); waits
//! are on the events themselves (a receiver, a write to the Lease), never a sleep. Durations are short (lease 3 s, renew deadline 2 s, retry
//! 200 ms) so a takeover after a lease runs out is seen in seconds.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::kube_fake::Exchange;
use common::lease_api::LeaseApiServer;
use common::recorded::Ids;
use common::until;
use common::webhook::TestServer;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::Value;
use tokio::sync::watch;
use tolerable::cluster::lease::{LeaderElection, LeaderElectionSettings};

const NAMESPACE: &str = "tolerable";
const LEASE: &str = "tolerable-gates";

fn settings(identity: &str, lease_duration: Duration) -> LeaderElectionSettings {
    LeaderElectionSettings {
        lease_duration,
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
        ..LeaderElectionSettings::new(NAMESPACE, identity)
    }
}

/// A replica: its election and its `tolerable_gate_leader` gauge.
struct Replica {
    election: LeaderElection,
    gauge: Gauge,
}

fn replica(api: &LeaseApiServer, identity: &str, lease_duration: Duration) -> Replica {
    let gauge = Gauge::default();
    let election = LeaderElection::start(
        api.client(identity),
        settings(identity, lease_duration),
        gauge.clone(),
    );
    Replica { election, gauge }
}

/// One change of a replica's `leader()` receiver, stamped when the recorder saw it (so never
/// before it happened), with who else said they led at that moment.
#[derive(Clone, Debug)]
struct Transition {
    identity: String,
    leading: bool,
    at: Timestamp,
    others_leading: Vec<String>,
}

/// A replica's identity and its `leader()` receiver.
type Watched = (String, watch::Receiver<bool>);

/// Every leadership transition every replica reports, recorded as it happens (a task per
/// receiver woken by each change, not a sampler): checked against the fake's log of every
/// accepted write to the Lease by [`Transitions::never_two`].
#[derive(Clone, Default)]
struct Transitions {
    log: Arc<Mutex<Vec<Transition>>>,
    receivers: Arc<Mutex<Vec<Watched>>>,
}

impl Transitions {
    fn start(replicas: &[(&str, &Replica)]) -> Self {
        let transitions = Self::default();
        for (identity, replica) in replicas {
            transitions.watch(identity, replica.election.leader());
        }
        transitions
    }

    /// Records `identity`'s transitions from now on (its current state first, if leading).
    fn watch(&self, identity: &str, mut receiver: watch::Receiver<bool>) {
        self.receivers
            .lock()
            .unwrap()
            .push((identity.to_owned(), receiver.clone()));
        let (this, identity) = (self.clone(), identity.to_owned());
        if *receiver.borrow_and_update() {
            this.record(&identity, true);
        }
        tokio::spawn(async move {
            // Ends when the election is gone (its sender dropped).
            while receiver.changed().await.is_ok() {
                let leading = *receiver.borrow_and_update();
                this.record(&identity, leading);
            }
        });
    }

    fn record(&self, identity: &str, leading: bool) {
        let at = Timestamp::now();
        // The other receivers' values now, as their senders last set them: no recorder lag.
        let others_leading = self
            .receivers
            .lock()
            .unwrap()
            .iter()
            .filter(|(other, r)| other != identity && *r.borrow())
            .map(|(other, _)| other.clone())
            .collect();
        self.log.lock().unwrap().push(Transition {
            identity: identity.to_owned(),
            leading,
            at,
            others_leading,
        });
    }

    /// Never two leaders, over every transition: the holders the Lease's accepted writes name
    /// never overlap (each new holder took over no sooner than the previous one's last renewal
    /// plus its lease duration, or after it cleared the holder); every period a replica said it
    /// led lies inside its own holding — begun no sooner than its acquire time, ended no later
    /// than its last renewal before then plus the lease duration — and no other replica said
    /// it led when it began. Returns how many holdings and leading periods there were.
    fn never_two(&self, api: &LeaseApiServer) -> (usize, usize) {
        let holdings = holdings(&api.writes());
        let log = self.log.lock().unwrap().clone();
        let mut periods = 0;
        for on in log.iter().filter(|t| t.leading) {
            assert!(
                on.others_leading.is_empty(),
                "{} began leading while {:?} led: {log:?}",
                on.identity,
                on.others_leading
            );
            let off = log
                .iter()
                .find(|t| t.identity == on.identity && !t.leading && t.at >= on.at);
            leading_inside_its_holding(on, off, &holdings);
            periods += 1;
        }
        (holdings.len(), periods)
    }
}

/// One replica's uninterrupted hold on the Lease, from the accepted writes.
#[derive(Debug)]
struct Holding {
    holder: String,
    acquired: Timestamp,
    renewals: Vec<Timestamp>,
    duration: SignedDuration,
    released: bool,
}

/// The holdings the fake's accepted writes record, in order; panics if two overlap.
fn holdings(writes: &[common::lease_api::Write]) -> Vec<Holding> {
    let mut holdings: Vec<Holding> = Vec::new();
    for write in writes {
        let spec = &write.lease["spec"];
        let Some(holder) = spec["holderIdentity"].as_str() else {
            // A release: only the holder clears itself.
            let last = holdings
                .last_mut()
                .expect("a release of a Lease never held");
            assert_eq!(last.holder, write.token, "released by another replica");
            last.released = true;
            continue;
        };
        assert_eq!(holder, write.token, "a write naming another replica");
        let renewed = micro_time(&write.lease, "renewTime");
        let seconds = spec["leaseDurationSeconds"].as_i64().unwrap();
        match holdings.last_mut() {
            Some(last) if last.holder == holder && !last.released => {
                assert_eq!(micro_time(&write.lease, "acquireTime"), last.acquired);
                last.renewals.push(renewed);
            }
            previous => {
                let acquired = micro_time(&write.lease, "acquireTime");
                if let Some(previous) = previous.filter(|p| !p.released) {
                    let ran_out = *previous.renewals.last().unwrap() + previous.duration;
                    assert!(
                        acquired >= ran_out,
                        "{holder} acquired at {acquired}, before {}'s lease ran out at {ran_out}",
                        previous.holder
                    );
                }
                holdings.push(Holding {
                    holder: holder.to_owned(),
                    acquired,
                    renewals: vec![renewed],
                    duration: SignedDuration::from_secs(seconds),
                    released: false,
                });
            }
        }
    }
    holdings
}

/// A leading period (`on` to `off`, or still leading) lies inside its replica's holding: begun
/// no sooner than the holding was acquired; ended (stamped no sooner than it ended) no later than
/// the replica's last renewal before then plus the lease duration.
fn leading_inside_its_holding(on: &Transition, off: Option<&Transition>, holdings: &[Holding]) {
    let own = |h: &&Holding| h.holder == on.identity && h.acquired <= on.at;
    let holding = holdings
        .iter()
        .rfind(own)
        .unwrap_or_else(|| panic!("{on:?} led without holding the Lease: {holdings:?}"));
    let Some(off) = off else { return };
    let renewed = holdings
        .iter()
        .filter(|h| h.holder == on.identity)
        .flat_map(|h| h.renewals.iter().map(move |r| (*r, h.duration)))
        .filter(|(r, _)| *r <= off.at)
        .max_by_key(|(r, _)| *r)
        .unwrap_or((holding.acquired, holding.duration));
    let ran_out = renewed.0 + renewed.1;
    assert!(
        off.at <= ran_out,
        "{} still led at {}, after its lease ran out at {ran_out}",
        on.identity,
        off.at
    );
}

fn leads(receiver: &watch::Receiver<bool>) -> bool {
    *receiver.borrow()
}

/// The Lease's holder as stored now.
fn holder(api: &LeaseApiServer) -> Option<String> {
    let lease = api.lease(NAMESPACE, LEASE)?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
}

/// Successful writes to the Lease made by `identity`.
fn writes_by(api: &LeaseApiServer, identity: &str) -> usize {
    api.writes().iter().filter(|w| w.token == identity).count()
}

fn micro_time(lease: &Value, field: &str) -> Timestamp {
    lease["spec"][field]
        .as_str()
        .unwrap_or_else(|| panic!("no spec.{field} in {lease}"))
        .parse()
        .unwrap()
}

/// The recorded request with the fake's resourceVersion in place of the recorded one.
fn as_sent_to_the_fake(exchange: &Exchange, ids: &Ids) -> Option<Value> {
    let mut body = exchange.request_body.clone()?;
    if let Some(Value::String(rv)) = body.pointer_mut("/metadata/resourceVersion") {
        *rv = ids.fake(rv);
    }
    Some(body)
}

/// The fake's answer with the values it made up replaced by the recorded ones they pair with
/// (each pairing held for the whole replay), so the rest compares field for field. The fake
/// writes no `managedFields`, so the recorded ones are left out.
fn aligned(mut fake: Value, recorded: &Value, ids: &mut Ids) -> (Value, Value) {
    let mut recorded = recorded.clone();
    for pointer in ["/metadata/uid", "/metadata/resourceVersion", "/details/uid"] {
        ids.align(&mut fake, &recorded, pointer);
    }
    if let Some(meta) = recorded["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    if let Some(created) = recorded.pointer("/metadata/creationTimestamp").cloned() {
        let made = fake.pointer_mut("/metadata/creationTimestamp");
        *made.expect("the fake stamps creationTimestamp") = created;
    }
    (fake, recorded)
}

/// Every exchange recorded from a real kube-apiserver v1.36.3
/// (`tests/data/kube-api/leases/exchanges.json`), replayed in order: the fake answers each with
/// the recorded status and the recorded body — among them the 201 for a PUT of a missing Lease,
/// the 422 for an update without resourceVersion, the 409s, the 500 for a malformed
/// resourceVersion and an unconditional merge patch.
#[tokio::test]
async fn the_fake_lease_api_answers_every_recorded_exchange_as_recorded() {
    let server = LeaseApiServer::start();
    let client = server.client("replica-a");
    let mut ids = Ids::default();
    let exchanges = common::kube_fake::exchanges("leases");
    assert_eq!(exchanges.len(), 15, "every recorded exchange");
    for (i, exchange) in exchanges.iter().enumerate() {
        let body = as_sent_to_the_fake(exchange, &ids);
        let content_type = exchange.request_content_type.as_deref();
        let (code, answer) = common::recorded::send(
            &client,
            &exchange.method,
            &exchange.path_and_query,
            content_type,
            body.as_ref(),
        )
        .await;
        let note = format!("exchange {i} ({})", exchange.name);
        assert_eq!(code, exchange.status, "{note}: {answer}");
        let want: Value = serde_json::from_slice(&exchange.body).unwrap_or(Value::Null);
        let (fake, recorded) = aligned(answer, &want, &mut ids);
        assert_eq!(fake, recorded, "{note}");
    }
}

/// What no recording shows is refused (501 NotImplemented) rather than answered as the fake
/// might guess: an update with an invalid spec, a list, and a strategic merge patch; the
/// Lease is left as it was.
#[tokio::test]
async fn the_fake_lease_api_refuses_what_no_recording_covers() {
    let server = LeaseApiServer::start();
    let api: Api<Lease> = Api::namespaced(server.client("replica-a"), NAMESPACE);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(LEASE.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("replica-a".into()),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }),
    };
    let mut invalid = api.create(&PostParams::default(), &lease).await.unwrap();
    invalid.spec.as_mut().unwrap().lease_duration_seconds = Some(0);
    let code = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("not an API refusal: {other}"),
    };
    let refused = api.replace(LEASE, &PostParams::default(), &invalid).await;
    assert_eq!(code(refused.unwrap_err()), (501, "NotImplemented".into()));
    let listed = api.list(&Default::default()).await;
    assert_eq!(code(listed.unwrap_err()), (501, "NotImplemented".into()));
    let patch = kube::api::Patch::Strategic(serde_json::json!({"spec": {"holderIdentity": "x"}}));
    let patched = api.patch(LEASE, &Default::default(), &patch).await;
    assert_eq!(code(patched.unwrap_err()), (501, "NotImplemented".into()));
    assert_eq!(holder(&server).as_deref(), Some("replica-a"));
    assert_eq!(server.writes().len(), 1, "only the create was applied");
}

/// A token without the Lease Role is refused with 403 Forbidden, in the shape of the recorded
/// 403s, and an unknown token gets the recorded 401.
#[tokio::test]
async fn the_fake_lease_api_refuses_callers_without_rights() {
    let server = LeaseApiServer::start();
    let code = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("not an API refusal: {other}"),
    };
    server.refuse("replica-a", true);
    let api: Api<Lease> = Api::namespaced(server.client("replica-a"), NAMESPACE);
    assert_eq!(
        code(api.get(LEASE).await.unwrap_err()),
        (403, "Forbidden".into())
    );
    let stranger: Api<Lease> = Api::namespaced(server.client("stranger"), NAMESPACE);
    let refused = stranger.get(LEASE).await.unwrap_err();
    assert_eq!(code(refused), (401, "Unauthorized".into()));
}

/// Two replicas competing for one Lease: one leads, the other never does while the leader
/// keeps renewing, and the Lease only ever names the leader.
#[tokio::test]
async fn of_two_replicas_exactly_one_leads() {
    let api = LeaseApiServer::start();
    let a = replica(&api, "replica-a", Duration::from_secs(3));
    let b = replica(&api, "replica-b", Duration::from_secs(3));
    let (ra, rb) = (a.election.leader(), b.election.leader());
    let transitions = Transitions::start(&[("replica-a", &a), ("replica-b", &b)]);
    until("a leader", || leads(&ra) || leads(&rb)).await;
    let (leader, follower) = if leads(&ra) { (&a, &b) } else { (&b, &a) };
    let leader_id = holder(&api).expect("the leader holds the Lease");
    // Through ten renewals (more than three lease durations at 200 ms a retry).
    let (renewed, asked) = (writes_by(&api, &leader_id), api.requests());
    until("ten renewals", || {
        writes_by(&api, &leader_id) >= renewed + 10
    })
    .await;
    // What that cost the API server: per retry period, the leader's GET and PUT and the
    // follower's GET (one period of slack each side).
    let requests = api.requests() - asked;
    assert!(requests <= 3 * 12, "{requests} requests for 10 renewals");
    assert!(leads(&leader.election.leader()));
    assert!(!leads(&follower.election.leader()));
    assert_eq!((leader.gauge.get(), follower.gauge.get()), (1, 0));
    let holders: std::collections::BTreeSet<String> = api
        .writes()
        .iter()
        .map(|w| {
            w.lease["spec"]["holderIdentity"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(holders.len(), 1, "the Lease changed hands: {holders:?}");
    assert_eq!(
        api.lease(NAMESPACE, LEASE).unwrap()["spec"]["leaseTransitions"],
        0
    );
    transitions.never_two(&api);
}

/// The leader dies without releasing (its task stops mid-term): the other replica takes over,
/// and not before the lease ran out as it observed it — never two leaders meanwhile.
#[tokio::test]
async fn a_leader_that_dies_is_replaced_once_its_lease_runs_out() {
    let api = LeaseApiServer::start();
    let lease_duration = Duration::from_secs(3);
    let a = replica(&api, "replica-a", lease_duration);
    let ra = a.election.leader();
    until("replica-a to lead", || leads(&ra)).await;
    let b = replica(&api, "replica-b", lease_duration);
    let rb = b.election.leader();
    let transitions = Transitions::start(&[("replica-a", &a), ("replica-b", &b)]);
    // replica-b has read the Lease at least once: replica-a renewed twice since it started.
    let renewed = writes_by(&api, "replica-a");
    until("two renewals", || {
        writes_by(&api, "replica-a") >= renewed + 2
    })
    .await;
    drop(a.election);
    let last_renewal = api.lease(NAMESPACE, LEASE).unwrap();
    assert!(!leads(&ra), "a stopped election says it does not lead");
    assert_eq!(a.gauge.get(), 0);
    until("replica-b to take over", || leads(&rb)).await;
    let taken = api.lease(NAMESPACE, LEASE).unwrap();
    assert_eq!(taken["spec"]["holderIdentity"], "replica-b");
    assert_eq!(taken["spec"]["leaseTransitions"], 1);
    // Not before the lease ran out: replica-b saw replica-a's last renewal no earlier than it
    // was written, and waited a whole lease duration from then.
    let waited =
        micro_time(&taken, "acquireTime").duration_since(micro_time(&last_renewal, "renewTime"));
    assert!(
        waited.as_secs_f64() >= lease_duration.as_secs_f64() - 0.001,
        "replica-b took over {waited:?} after replica-a's last renewal"
    );
    assert_eq!(b.gauge.get(), 1);
    transitions.never_two(&api);
}

/// A leader shut down gracefully clears the Lease's holder, and the other replica takes over
/// at once: the lease here lasts 60 s, longer than the test waits for the takeover.
#[tokio::test]
async fn a_leader_shut_down_hands_over_without_waiting_for_its_lease() {
    let api = LeaseApiServer::start();
    let lease_duration = Duration::from_secs(60);
    let a = replica(&api, "replica-a", lease_duration);
    let ra = a.election.leader();
    until("replica-a to lead", || leads(&ra)).await;
    let b = replica(&api, "replica-b", lease_duration);
    let rb = b.election.leader();
    let transitions = Transitions::start(&[("replica-a", &a), ("replica-b", &b)]);
    let asked = api.requests();
    until("replica-b to try", || api.requests() >= asked + 3).await;
    assert!(!leads(&rb));
    let gauge = a.gauge.clone();
    a.election.shutdown().await;
    assert!(!leads(&ra));
    assert_eq!(gauge.get(), 0);
    let release = api
        .writes()
        .into_iter()
        .rfind(|w| w.token == "replica-a")
        .unwrap();
    assert_eq!(release.method, "PUT");
    assert!(
        release.lease["spec"].get("holderIdentity").is_none(),
        "the release cleared the holder: {}",
        release.lease
    );
    until("replica-b to take over", || leads(&rb)).await;
    assert_eq!(holder(&api).as_deref(), Some("replica-b"));
    transitions.never_two(&api);
}

/// RBAC without the Lease Role (403 on every request): never leading, retried every retry
/// period, no panic; once allowed, the replica leads.
#[tokio::test]
async fn a_replica_refused_the_lease_does_not_lead_and_keeps_trying() {
    let api = LeaseApiServer::start();
    api.refuse("replica-a", true);
    let a = replica(&api, "replica-a", Duration::from_secs(3));
    let ra = a.election.leader();
    let transitions = Transitions::start(&[("replica-a", &a)]);
    until("five refused attempts", || api.requests() >= 5).await;
    assert!(!leads(&ra));
    assert_eq!(a.gauge.get(), 0);
    assert!(api.writes().is_empty());
    api.refuse("replica-a", false);
    until("replica-a to lead once allowed", || leads(&ra)).await;
    assert_eq!(a.gauge.get(), 1);
    transitions.never_two(&api);
}

/// replica-a leading (it has renewed the Lease once since replica-b joined), replica-b
/// following, and every transition of both recorded: where a fault is then done to the leader.
async fn leader_and_follower() -> (LeaseApiServer, Replica, Replica, Transitions) {
    let api = LeaseApiServer::start();
    let a = replica(&api, "replica-a", Duration::from_secs(3));
    let ra = a.election.leader();
    until("replica-a to lead", || leads(&ra)).await;
    let b = replica(&api, "replica-b", Duration::from_secs(3));
    let transitions = Transitions::start(&[("replica-a", &a), ("replica-b", &b)]);
    let renewed = writes_by(&api, "replica-a");
    until("a renewal", || writes_by(&api, "replica-a") > renewed).await;
    (api, a, b, transitions)
}

/// The leader loses access to the API server (403 from now on): it stops leading within its
/// renew deadline, before the other replica may take over, and the other replica does.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_it_is_replaced() {
    let (api, a, b, transitions) = leader_and_follower().await;
    let (ra, rb) = (a.election.leader(), b.election.leader());
    api.refuse("replica-a", true);
    until("replica-b to take over", || leads(&rb)).await;
    assert!(!leads(&ra));
    assert_eq!((a.gauge.get(), b.gauge.get()), (0, 1));
    transitions.never_two(&api);
}

/// The API server stops answering the leader (its requests hang): the leader's attempt ends at
/// its renew deadline and it stops leading then, before the other replica may take over, and
/// the other does.
#[tokio::test]
async fn a_leader_whose_requests_hang_steps_down_at_its_deadline() {
    let (api, a, b, transitions) = leader_and_follower().await;
    let (ra, rb) = (a.election.leader(), b.election.leader());
    api.hang("replica-a");
    until("replica-a to step down", || !leads(&ra)).await;
    until("replica-b to take over", || leads(&rb)).await;
    assert_eq!((a.gauge.get(), b.gauge.get()), (0, 1));
    transitions.never_two(&api);
}

/// The config `serve` runs with here (the test server puts HTTPS with the test CA's
/// certificate on a free port, `/metrics` on it): nothing read from the API but the Lease.
fn serve_config() -> tolerable::config::Config {
    let mut config = tolerable::config::Config::load(None, Vec::new()).unwrap();
    config.read_pull_secrets = false;
    config.watch_nodes = false;
    config
}

/// `serve` as the composition root builds it: by default it does not compete (nothing gates
/// Pods yet); competing, it leads, says so on `/metrics`, and when it shuts down (as on
/// SIGTERM) it stops leading and clears the Lease's holder.
#[tokio::test]
async fn serve_leads_says_so_and_gives_the_lease_up_when_it_shuts_down() {
    let api = LeaseApiServer::start();
    let idle = TestServer::start_as_serve(serve_config(), Some(api.client("replica-b"))).await;
    assert!(idle.leader.is_none());

    let election = settings("replica-a", Duration::from_secs(60));
    let client = Some(api.client("replica-a"));
    let mut server = TestServer::start_electing(serve_config(), client, election).await;
    let leader = server.leader.clone().expect("competing for the Lease");
    until("serve to lead", || leads(&leader)).await;
    assert_eq!(
        api.writes()[0].token,
        "replica-a",
        "only the competing server asked"
    );
    let metrics = common::webhook::metrics_text(&server).await;
    assert_eq!(
        common::webhook::metric_value(&metrics, "tolerable_gate_leader"),
        Some(1.0),
        "{metrics}"
    );
    server.shutdown().await;
    assert!(!leads(&leader));
    let lease = api.lease(NAMESPACE, LEASE).unwrap();
    assert!(lease["spec"].get("holderIdentity").is_none(), "{lease}");
    assert_eq!(api.writes().last().unwrap().token, "replica-a");
}

/// The identity of the one replica that says it leads, if one does.
fn leading(replicas: &std::collections::BTreeMap<&str, Replica>) -> Option<&'static str> {
    common::lease_api::TOKENS.into_iter().find(|id| {
        replicas
            .get(id)
            .is_some_and(|r| leads(&r.election.leader()))
    })
}

/// Three replicas, the Lease handed on six times — three leaders shut down (the holder
/// cleared, taken over at once) and three cut off from the API server (stepping down at their
/// renew deadline, taken over once the lease ran out): every transition and every accepted
/// write checked, never two leaders.
#[tokio::test]
async fn the_lease_changes_hands_many_times_and_never_two_lead() {
    let api = LeaseApiServer::start();
    let mut replicas: std::collections::BTreeMap<&str, Replica> = common::lease_api::TOKENS
        .into_iter()
        .map(|id| (id, replica(&api, id, Duration::from_secs(3))))
        .collect();
    let transitions = Transitions::default();
    for (id, r) in &replicas {
        transitions.watch(id, r.election.leader());
    }
    for round in 0..6 {
        until("a leader", || leading(&replicas).is_some()).await;
        let old = leading(&replicas).unwrap();
        if round % 2 == 0 {
            let stopped = replicas.remove(old).unwrap();
            stopped.election.shutdown().await;
            until("another leader", || leading(&replicas).is_some()).await;
            let restarted = replica(&api, old, Duration::from_secs(3));
            transitions.watch(old, restarted.election.leader());
            replicas.insert(old, restarted);
        } else {
            api.refuse(old, true);
            until("another leader", || {
                leading(&replicas).is_some_and(|new| new != old)
            })
            .await;
            api.refuse(old, false);
        }
        assert_ne!(holder(&api).as_deref(), Some(old), "round {round}");
    }
    let (holdings, periods) = transitions.never_two(&api);
    assert!(holdings >= 7, "{holdings} holdings");
    assert!(periods >= 7, "{periods} leading periods");
}

/// An accepted write by `holder` at `at` (seconds from a fixed instant), acquired at `acquired`.
fn write_at(holder: &str, acquired: i64, at: i64) -> common::lease_api::Write {
    let t =
        |s: i64| (Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1_800_000_000 + s)).to_string();
    common::lease_api::Write {
        method: "PUT",
        token: holder.to_owned(),
        lease: serde_json::json!({"spec": {
            "holderIdentity": holder,
            "acquireTime": t(acquired),
            "renewTime": t(at),
            "leaseDurationSeconds": 3,
        }}),
    }
}

/// The checks `never_two` makes can fail: a takeover before the previous holder's lease ran
/// out, and a replica still leading after its own lease ran out, are both refused; a takeover
/// once it ran out is not.
#[test]
fn the_never_two_checks_refuse_an_overlap() {
    let ran_out = [
        write_at("replica-a", 0, 0),
        write_at("replica-a", 0, 1),
        write_at("replica-b", 4, 4),
    ];
    assert_eq!(holdings(&ran_out).len(), 2);
    let early = [
        write_at("replica-a", 0, 0),
        write_at("replica-a", 0, 1),
        write_at("replica-b", 3, 3),
    ];
    assert!(std::panic::catch_unwind(|| holdings(&early)).is_err());

    let held = holdings(&ran_out);
    let at = |s: i64| Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1_800_000_000 + s);
    let transition = |leading: bool, s: i64| Transition {
        identity: "replica-a".into(),
        leading,
        at: at(s),
        others_leading: Vec::new(),
    };
    leading_inside_its_holding(&transition(true, 0), Some(&transition(false, 3)), &held);
    let late = std::panic::catch_unwind(|| {
        leading_inside_its_holding(&transition(true, 0), Some(&transition(false, 5)), &held)
    });
    assert!(
        late.is_err(),
        "a replica leading past its lease was not refused"
    );
}
