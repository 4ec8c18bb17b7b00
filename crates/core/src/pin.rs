//! Pinning (`[policy] pin_digests`, `tolerable.io/pin-digest`): each image by tag is rewritten
//! to `image@digest` of the manifest or index the decision was made on, so the kubelet pulls
//! what was inspected — on every start, restart and reschedule — even after the tag moves.
//! An image already by digest is left alone, which makes the rewrite its own fixed point (a
//! reinvocation finds every image by digest and changes nothing).

use std::collections::BTreeMap;

use super::facts::ImageFact;
use super::knobs::{Level, Resolved};
use super::pod::{PodView, SlotKind};

/// One image rewritten in the Pod spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    /// JSON Pointer of the `image` (or an image volume's `reference`).
    pub path: String,
    pub image: String,
}

/// Whether an image names its digest already (`name@sha256:…`, `name:tag@sha256:…`).
pub fn by_digest(image: &str) -> bool {
    image.contains('@')
}

/// `image@digest` for an image by tag whose digest is known; `None` for one by digest (left
/// alone) or whose digest is unknown.
pub fn pinned(image: &str, fact: &ImageFact) -> Option<String> {
    if by_digest(image) {
        return None;
    }
    Some(format!("{image}@{}", fact.digest.as_deref()?))
}

/// Every place of the Pod spec that names an image of `pinned` (as written, trimmed), with its
/// pinned form.
pub fn rewrites(pod: &PodView, pinned: &BTreeMap<&str, String>) -> Vec<Pin> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.images
        .iter()
        .filter_map(|slot| {
            let image = pinned.get(slot.image.as_deref()?.trim())?;
            let i = slot.index;
            let path = match slot.kind {
                SlotKind::InitContainer => format!("/spec/initContainers/{i}/image"),
                SlotKind::Container => format!("/spec/containers/{i}/image"),
                SlotKind::EphemeralContainer => format!("/spec/ephemeralContainers/{i}/image"),
                SlotKind::ImageVolume => format!("/spec/volumes/{i}/image/reference"),
            };
            Some(Pin {
                path,
                image: image.clone(),
            })
        })
        .collect()
}

/// Whether the Pod's images are pinned, which level said so, and each image's pinned form.
#[derive(Debug, Default)]
pub struct Pinning<'a> {
    /// The level that asked for pinning; `None`: not pinned.
    pub level: Option<Level>,
    /// Image as written → `image@digest`.
    pub pinned: BTreeMap<&'a str, String>,
}

impl<'a> Pinning<'a> {
    /// Pinning as resolved for the Pod (its own `tolerable.io/pin-digest`, else its
    /// Namespace's, else `pin_digests`): each known image's pinned form when on.
    pub fn of(setting: &Resolved<bool>, known: &[(&'a str, &ImageFact)]) -> Self {
        if !setting.value {
            return Self::default();
        }
        let pinned = known
            .iter()
            .filter_map(|(image, fact)| Some((*image, pinned(image, fact)?)))
            .collect();
        Self {
            level: Some(setting.level),
            pinned,
        }
    }

    /// How the summary names `image`: pinned, by its digest (so the summary reads the same
    /// when the pinned Pod is decided on again).
    pub fn shown(&self, image: &'a str) -> &str {
        self.pinned.get(image).map_or(image, String::as_str)
    }
}

#[cfg(test)]
mod tests;
