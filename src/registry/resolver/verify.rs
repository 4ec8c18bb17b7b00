//! `inspect --verify`, `audit --verify`: each platform an image's index claims, checked
//! against the config of the manifest it names.

use std::time::Duration;

use super::Resolver;
use crate::registry::bounds::LookupBounds;
use crate::registry::walk::{verify, Checked};
use crate::registry::{Credential, CredentialStore, FetchError, ImageReference, LookupError};

impl Resolver {
    /// Each platform the image's index claims, checked against the image config of the manifest
    /// it names (`inspect --verify`, `audit --verify`; never at admission: one blob GET per
    /// child). Asks as a lookup does — the mirror first, then the image's registry, with the
    /// same credentials in the same order — without the cache, within `budget`.
    pub(crate) async fn verify(
        &self,
        image: &str,
        first: &CredentialStore,
        budget: Duration,
    ) -> Result<Vec<Checked>, LookupError> {
        let reference = ImageReference::parse(image)?;
        // Every claimed child costs a manifest and a blob: the index's own limit bounds them.
        let bounds = LookupBounds::with_limits(
            self.registry_bytes.clone(),
            crate::registry::bounds::LOOKUP_BYTES_SHARE,
            2 * crate::registry::MAX_INDEX_ENTRIES + 1,
        );
        if let Some(mirror) = self.settings.mirrors.get(reference.registry()) {
            let chain: Vec<&Credential> = self.credentials.for_registry(mirror).iter().collect();
            let share = crate::budget::mirror_share(budget);
            match self
                .verify_at(&reference, ((mirror.as_str(), &bounds), &chain), share)
                .await
            {
                Ok(checked) => return Ok(checked),
                Err(e) => {
                    tracing::info!(image = ?image, mirror = ?mirror, error = ?e.to_string(), "mirror failed; asking the origin registry")
                }
            }
        }
        let chain: Vec<&Credential> = first
            .for_registry(reference.registry())
            .iter()
            .chain(self.credentials.for_registry(reference.registry()))
            .collect();
        self.verify_at(
            &reference,
            ((reference.api_host(), &bounds), &chain),
            budget,
        )
        .await
    }

    /// [`Resolver::verify`] at one host: each credential in turn, then anonymous.
    pub(super) async fn verify_at(
        &self,
        reference: &ImageReference,
        ((host, bounds), chain): ((&str, &LookupBounds), &[&Credential]),
        budget: Duration,
    ) -> Result<Vec<Checked>, LookupError> {
        let shown = reference.to_string();
        let mut tried = Vec::new();
        let attempts = chain.iter().map(|c| Some(*c)).chain(std::iter::once(None));
        for credential in attempts {
            tried.push(
                credential
                    .map_or("anonymous", Credential::source)
                    .to_owned(),
            );
            let source = self.client.source(host, credential, bounds);
            let checked = verify(
                &source,
                reference.repository(),
                reference.manifest_reference(),
            );
            let checked =
                tokio::time::timeout(budget, checked)
                    .await
                    .map_err(|_| LookupError::Timeout {
                        reference: shown.clone(),
                        after: budget,
                    })?;
            match checked {
                Err(FetchError::Unauthorized) => continue,
                Err(e) => return Err(e.into_lookup(&shown, host, &tried.join(", "))),
                Ok(checked) => return Ok(checked),
            }
        }
        Err(FetchError::Unauthorized.into_lookup(&shown, host, &tried.join(", ")))
    }
}
