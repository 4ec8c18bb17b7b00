//! The per-Pod knobs: what a Pod, its Namespace and the config may each say about how tolerable
//! treats the Pod — carry the decision out (`enforce`), leave the Pod alone (`skip`), pin its
//! images to the decided digests (`pin_digests`), prefer architectures (`preferred`) — with one
//! parser per knob used at every level and the one precedence step, [`resolve`]: the Pod's own
//! label or annotation, else its Namespace's, else the config; computed once per Pod
//! ([`crate::PodCreate`]), and the level that set each knob named in one place
//! ([`crate::explain::said_by`]).
//!
//! A new knob is a field of [`Knobs`], a [`Knob`] with its key, where a Namespace keeps it and
//! its parser, and its line in [`resolve`]; the readers of Pods and Namespaces need nothing new.

use std::collections::BTreeMap;

use super::arch::KUBERNETES_ARCHITECTURES;
use super::explain;
use super::WeightedArchitecture;

/// Label (on a Namespace) or label / annotation (on a Pod): `"false"` for report only, `"true"`
/// to enforce whatever `[policy] enforce` says.
pub const ENFORCE_KEY: &str = "tolerable.io/enforce";

/// Label (on a Namespace) or label / annotation (on a Pod): `"true"` leaves the Pod alone.
pub const SKIP_KEY: &str = "tolerable.io/skip";

/// Label (on a Namespace) or label / annotation (on a Pod): `"true"` to pin each image by tag
/// to the digest the decision was made on, `"false"` not to, whatever `[policy] pin_digests`
/// says.
pub const PIN_DIGEST_KEY: &str = "tolerable.io/pin-digest";

/// Annotation (on a Namespace) or label / annotation (on a Pod): the architectures to prefer
/// (`"arm64=80, amd64=20"`, one architecture, or `none`).
pub const PREFERRED_KEY: &str = "tolerable.io/preferred-architecture";

/// Weight of a preferred architecture named without one (1–100): a nudge other preferences can
/// outweigh.
pub const PREFERRED_WEIGHT: i32 = 50;

/// Longest piece of a malformed value quoted back in a warning (annotation values may be
/// large; the warning only needs to show which one).
const QUOTED_VALUE_BYTES: usize = 64;

/// Which level of policy set a knob (for the decision annotation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Pod,
    Namespace,
    Config,
}

/// What one level says of each knob; `None`: not said (or malformed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    pub enforce: Option<bool>,
    pub skip: Option<bool>,
    pub pin_digests: Option<bool>,
    /// `Some(empty)`: `none` (no preference, whatever the levels below prefer).
    pub preferred: Option<Vec<WeightedArchitecture>>,
}

/// Where a Namespace keeps a knob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A label: the webhook's `namespaceSelector` sees only labels, and `kubectl get ns -l`
    /// lists them.
    Label,
    /// An annotation: the value is no valid label value (`=`, `,` and spaces).
    Annotation,
}

/// One knob: its key, where a Namespace keeps it, and its parser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    Enforce,
    Skip,
    PinDigests,
    Preferred,
}

impl Knob {
    pub const ALL: [Knob; 4] = [Knob::Enforce, Knob::Skip, Knob::PinDigests, Knob::Preferred];

    pub fn key(self) -> &'static str {
        match self {
            Self::Enforce => ENFORCE_KEY,
            Self::Skip => SKIP_KEY,
            Self::PinDigests => PIN_DIGEST_KEY,
            Self::Preferred => PREFERRED_KEY,
        }
    }

    /// Where a Namespace keeps it (a Pod may use either).
    pub fn on_namespace(self) -> Place {
        match self {
            Self::Preferred => Place::Annotation,
            Self::Enforce | Self::Skip | Self::PinDigests => Place::Label,
        }
    }

    /// The config's key for the same knob (named in explanations).
    pub fn config_key(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Skip => "skip_namespaces",
            Self::PinDigests => "pin_digests",
            Self::Preferred => "preferred_architecture",
        }
    }

    /// Reads `value` into `knobs` — the one parser of this knob, at every level.
    fn read(self, value: &str, knobs: &mut Knobs) -> Result<(), String> {
        match self {
            Self::Enforce => knobs.enforce = Some(boolean(value)?),
            Self::Skip => knobs.skip = Some(boolean(value)?),
            Self::PinDigests => knobs.pin_digests = Some(boolean(value)?),
            Self::Preferred => knobs.preferred = Some(preference(value)?),
        }
        Ok(())
    }
}

/// A key that was ignored, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub key: &'static str,
    pub reason: String,
}

impl Knobs {
    /// A Namespace's labels and annotations: each knob from where a Namespace keeps it; a key
    /// in the other place, or a value that does not parse, is a problem.
    pub fn of_namespace(
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> (Self, Vec<Problem>) {
        fn get<'a>(map: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
            map.and_then(|m| m.get(key)).map(String::as_str)
        }
        let mut knobs = Self::default();
        let mut problems = Vec::new();
        for knob in Knob::ALL {
            let key = knob.key();
            let (kept, other) = match knob.on_namespace() {
                Place::Label => (get(labels, key), get(annotations, key)),
                Place::Annotation => (get(annotations, key), get(labels, key)),
            };
            if other.is_some() {
                let reason = match knob.on_namespace() {
                    Place::Label => "read from the Namespace's labels, not its annotations (the webhook's namespaceSelector sees only labels)",
                    Place::Annotation => "read from the Namespace's annotations, not its labels (a weighted list is no valid label value)",
                };
                problems.push(Problem {
                    key,
                    reason: reason.into(),
                });
            }
            if let Some(Err(reason)) = kept.map(|value| knob.read(value, &mut knobs)) {
                problems.push(Problem { key, reason });
            }
        }
        (knobs, problems)
    }

    /// A Pod's own knobs, each from its label, else its annotation (`label_or_annotation`); a
    /// value that does not parse is a problem.
    pub fn of_pod<'a>(value_of: impl Fn(&str) -> Option<&'a str>) -> (Self, Vec<Problem>) {
        let mut knobs = Self::default();
        let mut problems = Vec::new();
        for knob in Knob::ALL {
            if let Some(Err(reason)) = value_of(knob.key()).map(|v| knob.read(v, &mut knobs)) {
                problems.push(Problem {
                    key: knob.key(),
                    reason,
                });
            }
        }
        (knobs, problems)
    }

    /// Whether this level says nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A knob's value for one Pod and the level that set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved<T> {
    pub value: T,
    pub level: Level,
}

/// What the config says of each knob for a Pod in one Namespace (every knob has a value).
#[derive(Clone, Debug)]
pub struct ConfigKnobs {
    pub enforce: bool,
    /// The Namespace is in `skip_namespaces`.
    pub skip: bool,
    pub pin_digests: bool,
    pub preferred: Vec<WeightedArchitecture>,
}

/// Every knob's value for one Pod, and the level that set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub enforce: Resolved<bool>,
    /// The strongest level that opted the Pod out, if one did: each level can only opt out, so
    /// a Pod cannot opt back into a Namespace the platform team switched off.
    pub skip: Option<Level>,
    pub pin_digests: Resolved<bool>,
    pub preferred: Resolved<Vec<WeightedArchitecture>>,
}

/// The one precedence step: the Pod's value, else its Namespace's, else the config's.
pub fn resolve(pod: &Knobs, namespace: Option<&Knobs>, config: ConfigKnobs) -> Settings {
    // The config's values are moved in, not cloned: this runs once per admission.
    fn pick<T: Clone>(pod: &Option<T>, namespace: Option<&Option<T>>, config: T) -> Resolved<T> {
        match (pod, namespace.and_then(Option::as_ref)) {
            (Some(value), _) => Resolved {
                value: value.clone(),
                level: Level::Pod,
            },
            (None, Some(value)) => Resolved {
                value: value.clone(),
                level: Level::Namespace,
            },
            (None, None) => Resolved {
                value: config,
                level: Level::Config,
            },
        }
    }
    let skip = [
        (pod.skip, Level::Pod),
        (namespace.and_then(|n| n.skip), Level::Namespace),
        (Some(config.skip), Level::Config),
    ]
    .into_iter()
    .find(|(said, _)| *said == Some(true))
    .map(|(_, level)| level);
    Settings {
        enforce: pick(&pod.enforce, namespace.map(|n| &n.enforce), config.enforce),
        skip,
        pin_digests: pick(
            &pod.pin_digests,
            namespace.map(|n| &n.pin_digests),
            config.pin_digests,
        ),
        preferred: pick(
            &pod.preferred,
            namespace.map(|n| &n.preferred),
            config.preferred,
        ),
    }
}

/// `"true"` or `"false"`, exactly (as the API server's own boolean labels are written).
fn boolean(value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{} is not \"true\" or \"false\"", quoted(other))),
    }
}

/// `none`, one architecture (weight [`PREFERRED_WEIGHT`]) or `arch=weight, arch=weight`
/// (weights 1–100), each architecture a Kubernetes name, once.
pub fn preference(value: &str) -> Result<Vec<WeightedArchitecture>, String> {
    if value.trim() == "none" {
        return Ok(Vec::new());
    }
    let mut out: Vec<WeightedArchitecture> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (arch, weight) = match item.split_once('=') {
            None => (item, PREFERRED_WEIGHT),
            Some((arch, weight)) => match weight.trim().parse::<i32>() {
                Ok(w) if (1..=100).contains(&w) => (arch.trim(), w),
                _ => {
                    return Err(format!(
                        "{}: the weight is not a number from 1 to 100",
                        quoted(item)
                    ))
                }
            },
        };
        if !KUBERNETES_ARCHITECTURES.contains(&arch) {
            return Err(format!(
                "{} is not a Kubernetes architecture name (one of {})",
                quoted(arch),
                KUBERNETES_ARCHITECTURES.join(", ")
            ));
        }
        if out.iter().any(|w| w.architecture == arch) {
            return Err(format!("{arch} is named twice"));
        }
        out.push(WeightedArchitecture {
            architecture: arch.to_owned(),
            weight,
        });
    }
    if out.is_empty() {
        return Err("names no architecture (write none for no preference)".into());
    }
    Ok(out)
}

/// A value quoted back, cut to [`QUOTED_VALUE_BYTES`].
fn quoted(value: &str) -> String {
    format!("{:?}", explain::cut(value.to_owned(), QUOTED_VALUE_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ConfigKnobs {
        ConfigKnobs {
            enforce: true,
            skip: false,
            pin_digests: false,
            preferred: vec![WeightedArchitecture {
                architecture: "arm64".into(),
                weight: 10,
            }],
        }
    }

    fn pod(pairs: &[(&str, &str)]) -> (Knobs, Vec<Problem>) {
        Knobs::of_pod(|key| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v))
    }

    #[test]
    fn each_knob_is_the_pods_else_the_namespaces_else_the_configs() {
        let namespace = Knobs {
            enforce: Some(false),
            pin_digests: Some(true),
            preferred: Some(Vec::new()),
            ..Knobs::default()
        };
        let (own, problems) = pod(&[(ENFORCE_KEY, "true")]);
        assert!(problems.is_empty());
        let settings = resolve(&own, Some(&namespace), config());
        assert_eq!(settings.enforce.level, Level::Pod);
        assert!(settings.enforce.value);
        assert_eq!(settings.pin_digests.level, Level::Namespace);
        assert!(settings.pin_digests.value);
        assert_eq!(settings.preferred.level, Level::Namespace);
        assert!(settings.preferred.value.is_empty(), "none: no preference");
        let alone = resolve(&Knobs::default(), None, config());
        assert_eq!(
            (
                alone.enforce.level,
                alone.pin_digests.level,
                alone.preferred.level
            ),
            (Level::Config, Level::Config, Level::Config)
        );
        assert_eq!(alone.preferred.value, config().preferred);
    }

    #[test]
    fn skip_is_an_opt_out_at_any_level_and_names_the_strongest() {
        let opted_out = Knobs {
            skip: Some(true),
            ..Knobs::default()
        };
        let (stays, _) = pod(&[(SKIP_KEY, "false")]);
        assert_eq!(
            resolve(&stays, Some(&opted_out), config()).skip,
            Some(Level::Namespace),
            "a Pod cannot opt back in"
        );
        let (own, _) = pod(&[(SKIP_KEY, "true")]);
        assert_eq!(
            resolve(&own, Some(&opted_out), config()).skip,
            Some(Level::Pod)
        );
        let listed = ConfigKnobs {
            skip: true,
            ..config()
        };
        assert_eq!(
            resolve(&Knobs::default(), None, listed).skip,
            Some(Level::Config)
        );
        assert_eq!(resolve(&Knobs::default(), None, config()).skip, None);
    }

    #[test]
    fn one_parser_per_knob_at_every_level() {
        let labels = BTreeMap::from([
            (ENFORCE_KEY.to_owned(), "yes".to_owned()),
            (PIN_DIGEST_KEY.to_owned(), "true".to_owned()),
        ]);
        let annotations =
            BTreeMap::from([(PREFERRED_KEY.to_owned(), "arm64=80, amd64".to_owned())]);
        let (namespace, problems) = Knobs::of_namespace(Some(&labels), Some(&annotations));
        let (own, own_problems) = pod(&[
            (ENFORCE_KEY, "yes"),
            (PIN_DIGEST_KEY, "true"),
            (PREFERRED_KEY, "arm64=80, amd64"),
        ]);
        assert_eq!(
            namespace, own,
            "the same values read the same at both levels"
        );
        assert_eq!(
            problems, own_problems,
            "and the same malformed one is refused"
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, ENFORCE_KEY);
        assert_eq!(
            own.preferred.unwrap()[1],
            WeightedArchitecture {
                architecture: "amd64".into(),
                weight: PREFERRED_WEIGHT
            }
        );
    }

    #[test]
    fn a_namespace_key_in_the_wrong_place_is_a_problem() {
        let labels = BTreeMap::from([(PREFERRED_KEY.to_owned(), "arm64".to_owned())]);
        let annotations = BTreeMap::from([(SKIP_KEY.to_owned(), "true".to_owned())]);
        let (knobs, problems) = Knobs::of_namespace(Some(&labels), Some(&annotations));
        assert!(knobs.is_empty(), "{knobs:?}");
        let keys: Vec<&str> = problems.iter().map(|p| p.key).collect();
        assert_eq!(keys, [SKIP_KEY, PREFERRED_KEY]);
    }
}
