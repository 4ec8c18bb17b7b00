//! What tolerable reads from the cluster it serves: a Pod's image pull secrets (its own
//! `imagePullSecrets`, then its ServiceAccount's). Thin I/O over the `kube` client, cached so an
//! admission does not wait on the API server in the common case. Never fails an admission: what
//! cannot be read becomes a warning naming the secret, never its content. Also the node watch
//! (`nodes`) and paged lists of any kind (`list`, what `audit` reads through).

pub(crate) mod check;
pub(crate) mod connect;
pub(crate) mod crashes;
pub(crate) mod events;
pub(crate) mod gates;
pub mod lease;
pub(crate) mod list;
pub mod namespaces;
pub mod nodes;
pub(crate) mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::ByteString;
use kube::api::Api;
use moka::future::Cache;
use moka::Expiry;

use crate::registry::credentials::parse_docker_config;
use crate::registry::CredentialStore;

/// How long a Secret or ServiceAccount read is reused. Rotated pull secrets are picked up within
/// this; a missing one is looked for again as soon.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(30);
/// Reads that failed for a reason that may pass (API unreachable) are retried this soon.
const ERROR_TTL: Duration = Duration::from_secs(2);
/// What the Secret and ServiceAccount caches may hold, each, in bytes (weighed by what they
/// keep: registry names, credentials, secret names, warnings), whatever the Secrets hold: a
/// bound per cache, not per entry (a 1 MiB docker config is weighed as such).
const MAX_CACHED_BYTES: u64 = 8 << 20;

/// Roughly what a cached read keeps, in bytes (the key, the value and the cache's own
/// per-entry overhead).
fn weight(key: &(String, String), kept: usize) -> u32 {
    u32::try_from(key.0.len() + key.1.len() + kept + 128).unwrap_or(u32::MAX)
}

impl SecretRead {
    fn kept_bytes(&self) -> usize {
        match self {
            Self::Credentials(entries, warnings) => {
                entries
                    .iter()
                    .map(|(registry, c)| {
                        registry.len() + c.user().len() + c.secret().len() + c.source().len() + 96
                    })
                    .sum::<usize>()
                    + warnings.iter().map(String::len).sum::<usize>()
            }
            Self::Problem(why) | Self::Transient(why) => why.len(),
            Self::Forbidden => 0,
        }
    }
}

impl AccountRead {
    fn kept_bytes(&self) -> usize {
        match self {
            Self::PullSecrets(names) => names.iter().map(|n| n.len() + 24).sum(),
            Self::Problem(why) | Self::Transient(why) => why.len(),
            Self::Forbidden => 0,
        }
    }
}

/// Where a Pod's registry credentials are named: its `imagePullSecrets` and its ServiceAccount.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PullSecretRefs {
    /// Secret names, in the order the Pod lists them.
    pub(crate) secrets: Vec<String>,
    /// `spec.serviceAccountName`; `None`: `default`.
    pub(crate) service_account: Option<String>,
}

/// What one Secret gave: credentials by registry, or why it gave none.
#[derive(Clone, Debug)]
enum SecretRead {
    Credentials(Vec<(String, crate::registry::Credential)>, Vec<String>),
    Problem(String),
    Transient(String),
    /// RBAC does not let tolerable read it (403): said once per Pod, for the namespace.
    Forbidden,
}

#[derive(Clone, Debug)]
enum AccountRead {
    PullSecrets(Vec<String>),
    Problem(String),
    Transient(String),
    Forbidden,
}

struct ReadExpiry;

impl Expiry<(String, String), Arc<SecretRead>> for ReadExpiry {
    fn expire_after_create(
        &self,
        _: &(String, String),
        value: &Arc<SecretRead>,
        _: Instant,
    ) -> Option<Duration> {
        Some(match value.as_ref() {
            SecretRead::Transient(_) => ERROR_TTL,
            _ => CACHE_TTL,
        })
    }
}

impl Expiry<(String, String), Arc<AccountRead>> for ReadExpiry {
    fn expire_after_create(
        &self,
        _: &(String, String),
        value: &Arc<AccountRead>,
        _: Instant,
    ) -> Option<Duration> {
        Some(match value.as_ref() {
            AccountRead::Transient(_) => ERROR_TTL,
            _ => CACHE_TTL,
        })
    }
}

/// The credentials a Pod's pull secrets provide, in precedence order (Pod, then ServiceAccount),
/// and what could not be used.
#[derive(Debug, Default)]
pub(crate) struct PodCredentials {
    pub(crate) credentials: CredentialStore,
    pub(crate) warnings: Vec<String>,
    /// RBAC forbade reading the Pod's ServiceAccount or a pull secret in its namespace.
    pub(crate) forbidden: bool,
}

/// The warning for a Pod whose namespace tolerable may not read pull secrets in.
fn no_access(namespace: &str) -> String {
    format!(
        "no access to pull secrets in {namespace} (RBAC: tolerable may not get secrets and \
         serviceaccounts there); its images were looked up without them"
    )
}

fn secret_cache() -> Cache<(String, String), Arc<SecretRead>> {
    Cache::builder()
        .max_capacity(MAX_CACHED_BYTES)
        .weigher(|key, read: &Arc<SecretRead>| weight(key, read.kept_bytes()))
        .expire_after(ReadExpiry)
        .build()
}

pub struct Cluster {
    client: kube::Client,
    secrets: Cache<(String, String), Arc<SecretRead>>,
    accounts: Cache<(String, String), Arc<AccountRead>>,
}

impl Cluster {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            secrets: secret_cache(),
            accounts: Cache::builder()
                .max_capacity(MAX_CACHED_BYTES)
                .weigher(|key, read: &Arc<AccountRead>| weight(key, read.kept_bytes()))
                .expire_after(ReadExpiry)
                .build(),
        }
    }

    /// The Pod's pull credentials: its `imagePullSecrets`, then its ServiceAccount's, each
    /// Secret's entries in the order the Secret lists them.
    pub(crate) async fn pull_credentials(
        &self,
        namespace: &str,
        refs: &PullSecretRefs,
    ) -> PodCredentials {
        let mut out = PodCredentials::default();
        let mut names: Vec<String> = refs
            .secrets
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect();
        let account = refs
            .service_account
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or("default");
        match self.account(namespace, account).await.as_ref() {
            AccountRead::PullSecrets(secrets) => names.extend(secrets.iter().cloned()),
            AccountRead::Problem(why) | AccountRead::Transient(why) => {
                out.warnings.push(why.clone())
            }
            AccountRead::Forbidden => out.forbidden = true,
        }
        let mut seen = std::collections::HashSet::new();
        for name in names.into_iter().filter(|n| seen.insert(n.clone())) {
            match self.secret(namespace, &name).await.as_ref() {
                SecretRead::Credentials(entries, warnings) => {
                    for (registry, credential) in entries {
                        out.credentials.add(registry, credential.clone());
                    }
                    out.warnings.extend(warnings.iter().cloned());
                }
                SecretRead::Problem(why) | SecretRead::Transient(why) => {
                    out.warnings.push(why.clone())
                }
                SecretRead::Forbidden => out.forbidden = true,
            }
        }
        if out.forbidden {
            out.warnings.push(no_access(namespace));
        }
        out
    }

    async fn account(&self, namespace: &str, name: &str) -> Arc<AccountRead> {
        read_through(&self.accounts, namespace, name, || async {
            let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
            let what = format!("serviceaccount {namespace}/{name}");
            Arc::new(match api.get_opt(name).await {
                Ok(Some(account)) => AccountRead::PullSecrets(
                    account
                        .image_pull_secrets
                        .unwrap_or_default()
                        .into_iter()
                        .map(|r| r.name)
                        .filter(|n| !n.is_empty())
                        .collect(),
                ),
                // Admission can run before the ServiceAccount controller creates `default`.
                Ok(None) => AccountRead::PullSecrets(Vec::new()),
                Err(e) if is_forbidden(&e) => AccountRead::Forbidden,
                Err(e) => match classify(&e, &what) {
                    Ok(problem) => AccountRead::Problem(problem),
                    Err(transient) => AccountRead::Transient(transient),
                },
            })
        })
        .await
    }

    async fn secret(&self, namespace: &str, name: &str) -> Arc<SecretRead> {
        read_through(&self.secrets, namespace, name, || async {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
            let what = format!("image pull secret {namespace}/{name}");
            Arc::new(match api.get_opt(name).await {
                Ok(Some(secret)) => read_secret(&secret, &what),
                Ok(None) => SecretRead::Problem(format!("{what} not found; ignored")),
                Err(e) if is_forbidden(&e) => SecretRead::Forbidden,
                Err(e) => match classify(&e, &what) {
                    Ok(problem) => SecretRead::Problem(problem),
                    Err(transient) => SecretRead::Transient(transient),
                },
            })
        })
        .await
    }
}

/// What `cache` holds for `(namespace, name)`, or what `read` reads on a miss (once for
/// concurrent callers). A hit — nearly every admission — is looked up by a borrowed key and
/// allocates nothing; only a miss builds the owned key and the Kubernetes read's future, boxed
/// because it is large.
async fn read_through<V, F>(
    cache: &Cache<(String, String), Arc<V>>,
    namespace: &str,
    name: &str,
    read: impl FnOnce() -> F,
) -> Arc<V>
where
    V: Send + Sync + 'static,
    F: std::future::Future<Output = Arc<V>>,
{
    if let Some(hit) = cache.get(&KeyRef(namespace, name)).await {
        return hit;
    }
    Box::pin(cache.get_with((namespace.to_owned(), name.to_owned()), read())).await
}

/// A `(namespace, name)` cache key borrowed: a hit (nearly every admission) allocates nothing,
/// where an owned key costs two Strings and moka's `Arc` of them per read.
struct KeyRef<'a>(&'a str, &'a str);

impl std::hash::Hash for KeyRef<'_> {
    /// As the owned tuple hashes (each field in turn), so both find the same entry.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl moka::Equivalent<(String, String)> for KeyRef<'_> {
    fn equivalent(&self, key: &(String, String)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

/// RBAC refused the read (403): the namespace is one tolerable was given no access to.
fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 403)
}

/// `Ok(message)` for an answer that will not change soon (unauthenticated), `Err(message)` for
/// one that may (the API server unreachable, overloaded).
fn classify(e: &kube::Error, what: &str) -> Result<String, String> {
    match e {
        kube::Error::Api(status) if status.code == 401 => Ok(format!(
            "tolerable is not authenticated to the API server to read {what}; ignored"
        )),
        kube::Error::Api(status) => Err(format!(
            "could not read {what}: API server answered {} {}; ignored",
            status.code, status.reason
        )),
        other => Err(format!("could not read {what}: {other}; ignored")),
    }
}

/// A `kubernetes.io/dockerconfigjson` or `kubernetes.io/dockercfg` Secret's credentials.
fn read_secret(secret: &Secret, what: &str) -> SecretRead {
    let data = secret.data.as_ref();
    let payload = |key: &str| {
        data.and_then(|d| d.get(key))
            .map(|ByteString(bytes)| bytes.as_slice())
    };
    let json = match secret.type_.as_deref() {
        Some("kubernetes.io/dockerconfigjson") => payload(".dockerconfigjson"),
        Some("kubernetes.io/dockercfg") => payload(".dockercfg"),
        other => {
            return SecretRead::Problem(format!(
                "{what} is of type {}, not kubernetes.io/dockerconfigjson; ignored",
                other.unwrap_or("Opaque")
            ))
        }
    };
    let Some(json) = json else {
        return SecretRead::Problem(format!("{what} has no docker config key; ignored"));
    };
    match parse_docker_config(
        json,
        &format!("secret {}", what.trim_start_matches("image pull secret ")),
    ) {
        Ok((entries, warnings)) => SecretRead::Credentials(entries, warnings),
        Err(e) => SecretRead::Problem(format!("{what}: {e}; ignored")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read by the borrowed key finds what the owned key stored, and only that: the two hash
    /// alike in the caches' own hasher.
    #[tokio::test]
    async fn a_borrowed_key_finds_the_entry_of_its_owned_key() {
        let cache = secret_cache();
        let read = Arc::new(SecretRead::Problem("not found".into()));
        cache
            .insert(("apps".into(), "regcred".into()), read.clone())
            .await;
        let hit = cache.get(&KeyRef("apps", "regcred")).await;
        assert!(hit.is_some_and(|hit| Arc::ptr_eq(&hit, &read)));
        for (namespace, name) in [("apps", "other"), ("app", "sregcred"), ("regcred", "apps")] {
            assert!(cache.get(&KeyRef(namespace, name)).await.is_none());
        }
    }

    /// Large docker configs fill the cache by their size, not by their count: 64 Secrets of
    /// 512 KiB of credentials each are more than the cache may hold, and it keeps within its
    /// bytes.
    #[tokio::test]
    async fn the_secret_cache_is_bounded_by_bytes_not_by_entries() {
        let cache = secret_cache();
        let credential =
            crate::registry::Credential::new("u", "p".repeat(512 << 10), "secret ns/x");
        for i in 0..64 {
            let read = SecretRead::Credentials(
                vec![(format!("r{i}.example"), credential.clone())],
                Vec::new(),
            );
            assert!(read.kept_bytes() > 512 << 10);
            cache
                .insert(("ns".into(), format!("s{i}")), Arc::new(read))
                .await;
        }
        cache.run_pending_tasks().await;
        assert!(
            cache.weighted_size() <= MAX_CACHED_BYTES,
            "{}",
            cache.weighted_size()
        );
        assert!(
            cache.entry_count() < 64,
            "{} entries kept",
            cache.entry_count()
        );
        assert!(
            cache.entry_count() >= 8,
            "{} entries kept",
            cache.entry_count()
        );
    }
}
