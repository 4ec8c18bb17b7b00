//! Healing a wrong-architecture crash (issue 38, `[crashes] heal`), pure: whether the Pod that
//! crashed may be deleted so that its controller recreates it — and the webhook places the new
//! Pod on an architecture the image runs on — and the words the Events say about it. The shell
//! reads the Pod, asks the engine where the Pod's images would go now, keeps the rate limits
//! and sends the delete.

use super::explain::comma_list;

/// A volume of the Pod, as far as healing cares: what deleting the Pod would lose or strand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeKind {
    /// `emptyDir` with its `medium` (`None` or `""`: the node's disk).
    EmptyDir(Option<String>),
    HostPath,
    PersistentVolumeClaim,
    /// A generic ephemeral volume (a PVC made for the Pod).
    Ephemeral,
    /// configMap, secret, projected, downwardAPI, a network volume…: nothing of the node's.
    Other,
}

/// One volume: its name and kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub kind: VolumeKind,
}

/// The controller owner of the Pod: its `apiVersion` and `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
}

/// Why a Pod is not healed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// No controller owner: nothing would recreate it.
    NoController,
    /// A DaemonSet's Pod: recreated on the same node, where the image does not run either.
    DaemonSet,
    /// A controller tolerable does not know to recreate its Pods elsewhere.
    UnknownController(String),
    /// A volume whose data deleting the Pod loses or strands on the node.
    LocalData { volume: String, why: &'static str },
    /// The decision for the Pod's images now would not place it elsewhere: the node's
    /// architecture is still among them, none is left, or they could not be looked up.
    NotElsewhere,
    /// This Pod was deleted to heal before (at most once per Pod).
    HealedBefore,
    /// Another Pod of the same controller was deleted to heal within the window (at most one
    /// per controller per window: its new Pods must get the time to start).
    OwnerHealedRecently { window_minutes: u64 },
    /// As many Pods as allowed in all were deleted to heal within the window.
    TooManyHeals { at_most: usize, window_minutes: u64 },
    /// Replaced by a Pod of the same name, or gone, before the delete.
    Gone,
    /// The API server refused the delete, or did not answer.
    Failed,
}

/// The controllers that recreate a deleted Pod, anywhere their selector allows: by API group
/// and kind (the version does not matter). Not a Job: its controller counts a deleted running
/// Pod as failed, so a heal could spend the Job's `backoffLimit` and fail it.
const RECREATING: &[(&str, &str)] = &[
    ("apps", "ReplicaSet"),
    ("apps", "StatefulSet"),
    ("", "ReplicationController"),
];

fn group(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

/// Whether the Pod owned by `owner` with `volumes` may be deleted for its controller to
/// recreate it. What counts as local data follows the cluster autoscaler's rule for Pods it
/// will not evict from a node, plus claims:
/// - `emptyDir` on the node's disk (a medium other than `Memory`): scratch data a Pod may
///   expect to keep across its containers' restarts, lost with the Pod;
/// - `hostPath`: data on this node, which the recreated Pod (on another node) would not find;
/// - a `persistentVolumeClaim` or generic ephemeral volume: its volume may be a local
///   PersistentVolume, which pins the Pod to this node — deleting it would only restart it
///   where it crashes. The crash watch does not read claims and volumes (no RBAC for them,
///   and no recording of those reads), so every claim is held.
///
/// An in-memory `emptyDir` is no reason: it lives no longer than the Pod on any node.
pub fn may_heal(owner: Option<Owner<'_>>, volumes: &[Volume]) -> Result<(), Held> {
    let owner = owner.ok_or(Held::NoController)?;
    let key = (group(owner.api_version), owner.kind);
    if key == ("apps", "DaemonSet") {
        return Err(Held::DaemonSet);
    }
    if !RECREATING.contains(&key) {
        return Err(Held::UnknownController(owner.kind.to_owned()));
    }
    for volume in volumes {
        let why = match &volume.kind {
            VolumeKind::EmptyDir(medium) if medium.as_deref() != Some("Memory") => {
                "an emptyDir on the node's disk"
            }
            VolumeKind::HostPath => "a hostPath",
            VolumeKind::PersistentVolumeClaim | VolumeKind::Ephemeral => {
                "a claim, maybe a local volume on this node"
            }
            VolumeKind::EmptyDir(_) | VolumeKind::Other => continue,
        };
        return Err(Held::LocalData {
            volume: volume.name.clone(),
            why,
        });
    }
    Ok(())
}

/// Whether the architectures the Pod's images would be placed on now (`common`: the engine's
/// decision with the learned architectures left out; `None`: not decided) move it off
/// `node_arch`: some are left, and `node_arch` is not among them.
pub fn places_elsewhere(node_arch: &str, common: Option<&[String]>) -> Result<(), Held> {
    match common {
        Some(archs) if !archs.is_empty() && !archs.iter().any(|a| a == node_arch) => Ok(()),
        _ => Err(Held::NotElsewhere),
    }
}

impl Held {
    /// Why not, for the Event's note.
    pub fn describe(&self) -> String {
        match self {
            Self::NoController => "it has no controller to recreate it".to_owned(),
            Self::DaemonSet => "a DaemonSet's Pod is recreated on the same node".to_owned(),
            Self::UnknownController(kind) => {
                format!("its controller, a {kind}, is not one known to recreate it elsewhere")
            }
            Self::LocalData { volume, why } => {
                format!("its volume {volume} is {why}")
            }
            Self::NotElsewhere => {
                "the decision for its images would not place it elsewhere".to_owned()
            }
            Self::HealedBefore => "it was deleted before".to_owned(),
            Self::OwnerHealedRecently { window_minutes } => {
                format!("another Pod of its controller was deleted within {window_minutes} minutes")
            }
            Self::TooManyHeals {
                at_most,
                window_minutes,
            } => format!("{at_most} Pods were deleted within {window_minutes} minutes"),
            Self::Gone => "it was gone or replaced already".to_owned(),
            Self::Failed => "the delete failed".to_owned(),
        }
    }

    /// The metric's label: `held` (the rules), `limited` (the rate limits), `gone`, `failed`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoController
            | Self::DaemonSet
            | Self::UnknownController(_)
            | Self::LocalData { .. }
            | Self::NotElsewhere => "held",
            Self::HealedBefore | Self::OwnerHealedRecently { .. } | Self::TooManyHeals { .. } => {
                "limited"
            }
            Self::Gone => "gone",
            Self::Failed => "failed",
        }
    }
}

/// The metric's labels, in its order: deleted, and each [`Held::label`].
pub const LABELS: [&str; 5] = ["deleted", "held", "limited", "gone", "failed"];

/// The Event's words for a Pod deleted to heal: who recreates it and where its images go now.
pub fn healed(owner_kind: &str, owner_name: &str, archs: &[String]) -> String {
    format!(
        "deleted the Pod (crashes.heal): its {owner_kind} {owner_name} recreates it, its images now placed on {}",
        comma_list(archs)
    )
}

/// The Event's words for a Pod not deleted, and why.
pub fn not_healed(why: &str) -> String {
    format!("not deleted (crashes.heal): {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(name: &str, kind: VolumeKind) -> Volume {
        Volume {
            name: name.into(),
            kind,
        }
    }

    const RS: Owner<'static> = Owner {
        api_version: "apps/v1",
        kind: "ReplicaSet",
    };

    #[test]
    fn only_pods_a_controller_recreates_elsewhere() {
        let owner = |api_version, kind| Some(Owner { api_version, kind });
        let table: &[(Option<Owner<'_>>, Result<(), Held>)] = &[
            (Some(RS), Ok(())),
            (owner("apps/v1", "StatefulSet"), Ok(())),
            (
                owner("batch/v1", "Job"),
                Err(Held::UnknownController("Job".into())),
            ),
            (owner("v1", "ReplicationController"), Ok(())),
            (None, Err(Held::NoController)),
            (owner("apps/v1", "DaemonSet"), Err(Held::DaemonSet)),
            // A ReplicaSet of another group is not the one the table knows.
            (
                owner("example.com/v1", "ReplicaSet"),
                Err(Held::UnknownController("ReplicaSet".into())),
            ),
            (
                owner("batch/v1", "CronJob"),
                Err(Held::UnknownController("CronJob".into())),
            ),
        ];
        for (owner, expected) in table {
            assert_eq!(&may_heal(*owner, &[]), expected, "{owner:?}");
        }
    }

    #[test]
    fn pods_with_local_data_are_held() {
        let memory = volume("cache", VolumeKind::EmptyDir(Some("Memory".into())));
        let config = volume("config", VolumeKind::Other);
        assert_eq!(may_heal(Some(RS), &[memory.clone(), config]), Ok(()));
        for (held, why) in [
            (volume("scratch", VolumeKind::EmptyDir(None)), "an emptyDir"),
            (
                volume("scratch", VolumeKind::EmptyDir(Some(String::new()))),
                "an emptyDir",
            ),
            (volume("data", VolumeKind::HostPath), "a hostPath"),
            (volume("data", VolumeKind::PersistentVolumeClaim), "a claim"),
            (volume("data", VolumeKind::Ephemeral), "a claim"),
        ] {
            let found = may_heal(Some(RS), &[memory.clone(), held.clone()]);
            let Err(Held::LocalData { volume, why: said }) = found else {
                panic!("{held:?}: {found:?}");
            };
            assert_eq!(volume, held.name);
            assert!(said.starts_with(why), "{said}");
        }
    }

    #[test]
    fn healed_only_when_the_decision_moves_the_pod() {
        let archs = |list: &[&str]| list.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        assert_eq!(places_elsewhere("arm64", Some(&archs(&["amd64"]))), Ok(()));
        for common in [Some(archs(&["amd64", "arm64"])), Some(archs(&[])), None] {
            assert_eq!(
                places_elsewhere("arm64", common.as_deref()),
                Err(Held::NotElsewhere),
                "{common:?}"
            );
        }
    }

    #[test]
    fn the_words_name_the_owner_and_the_architectures() {
        let note = healed("ReplicaSet", "web-1", &["amd64".to_owned()]);
        assert_eq!(
            note,
            "deleted the Pod (crashes.heal): its ReplicaSet web-1 recreates it, its images now placed on amd64"
        );
        let held = not_healed(&Held::DaemonSet.describe());
        assert_eq!(
            held,
            "not deleted (crashes.heal): a DaemonSet's Pod is recreated on the same node"
        );
    }
}
