//! Where a lookup's credentials come from, in the order they are tried: a Pod's pull secrets,
//! the credential provider plugins matching the image, the configured credentials, the Docker
//! config's credential helper — then anonymous access. Each source's fingerprint is part of
//! every cache key of the lookup.

use super::Resolver;
use crate::registry::credentials::helper::Helper;
use crate::registry::credentials::plugins::{helper_label, PluginFailure};
use crate::registry::shared::{Keys, SharedCache};
use crate::registry::{Credential, CredentialStore, ImageReference};

/// Where a lookup's credentials come from, in the order they are tried (then anonymous).
#[derive(Clone, Debug)]
pub(super) enum Source {
    /// A pull secret's, a credential file's, the Docker config's.
    Credential(Credential),
    /// A credential provider plugin (by index), run when reached.
    Provider(usize),
    /// The Docker config's credential helper for the registry, run when reached.
    Helper(Helper),
}

/// The lookup's keys in the shared cache: only when every source is a credential. A plugin's
/// credentials are minted per run (and its name is no identity other replicas share), so such
/// lookups keep to the in-memory cache.
pub(super) fn shared_keys(
    shared: &SharedCache,
    reference: &ImageReference,
    chain: &[Source],
    fingerprints: &[u64],
) -> Option<Keys> {
    let credentials: Vec<Credential> = chain
        .iter()
        .map(|source| match source {
            Source::Credential(credential) => Some(credential.clone()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some(shared.keys(reference, &credentials, fingerprints))
}

impl Resolver {
    /// The sources to try for `reference`: `first` (a Pod's pull secrets), the credential
    /// providers matching the image, the configured credentials, the Docker config's helper.
    pub(super) fn chain(&self, reference: &ImageReference, first: &CredentialStore) -> Vec<Source> {
        let registry = reference.registry();
        let image = format!("{registry}/{}", reference.repository());
        let statics = |store: &CredentialStore| {
            store
                .for_registry(registry)
                .iter()
                .cloned()
                .map(Source::Credential)
                .collect::<Vec<_>>()
        };
        let mut chain = statics(first);
        chain.extend(self.plugins.providers_for(&image).map(Source::Provider));
        chain.extend(statics(&self.credentials));
        chain.extend(
            self.plugins
                .helper_for(registry)
                .cloned()
                .map(Source::Helper),
        );
        chain
    }

    /// A source's part of a cache key: two lookups trying different sources must not share an
    /// answer.
    pub(super) fn fingerprint(&self, source: &Source) -> u64 {
        match source {
            Source::Credential(credential) => self.client.fingerprint(credential),
            Source::Provider(index) => self
                .client
                .fingerprint_label(&self.plugins.provider_label(*index)),
            Source::Helper(helper) => self.client.fingerprint_label(&helper_label(helper)),
        }
    }

    /// How lookups name a plugin source.
    pub(super) fn label(&self, source: &Source) -> String {
        match source {
            Source::Credential(credential) => credential.source().to_owned(),
            Source::Provider(index) => self.plugins.provider_label(*index),
            Source::Helper(helper) => helper_label(helper),
        }
    }

    /// What a plugin source gives for the image, within its share of what is left before
    /// `deadline`.
    pub(super) async fn plugin_credentials(
        &self,
        source: &Source,
        reference: &ImageReference,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Credential>, PluginFailure> {
        let now = tokio::time::Instant::now();
        let plugin_deadline =
            now + crate::budget::credential_plugin_share(deadline.saturating_duration_since(now));
        let observer = self.observer.as_deref();
        let registry = reference.registry();
        match source {
            Source::Credential(credential) => Ok(vec![credential.clone()]),
            Source::Provider(index) => {
                let image = format!("{registry}/{}", reference.repository());
                self.plugins
                    .provider_credentials(*index, &image, registry, plugin_deadline, observer)
                    .await
            }
            Source::Helper(helper) => {
                self.plugins
                    .helper_credentials(helper, registry, plugin_deadline, observer)
                    .await
            }
        }
    }
}
