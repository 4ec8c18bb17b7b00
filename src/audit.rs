//! `tolerable audit`'s judgement of one running workload, from what is already known: the
//! architectures its images share, what the webhook would add to its Pods, and the nodes its
//! Pods sit on. Pure, so every status is a plain table test; `cmd/audit.rs` gathers the facts.

use std::collections::BTreeMap;

use serde::Serialize;

pub(crate) mod node_agents;
pub(crate) mod seen;

/// How many Pods a reason names before it says "and N more".
const PODS_NAMED: usize = 3;

/// One status per workload ([`judge`] says which applies first); declared in the order
/// reports list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// A running Pod sits on a node whose architecture its images do not support (it is
    /// crash-looping, or will on its next restart).
    Misplaced,
    /// Its images also support a tainted pool's architecture (arm64), none of its Pods runs
    /// there yet, and tolerable would add the tolerations or steering: it can move (the
    /// savings candidates).
    Movable,
    /// Multi-architecture and already tolerated / steered as tolerable would, or already
    /// running on the tainted pools.
    Ready,
    /// Some image is single-architecture, or the architectures the images share include no
    /// tainted pool's: the workload stays where it runs.
    Pinned,
    /// Some image could not be resolved.
    Unknown,
}

impl Status {
    pub(crate) const ALL: [Self; 5] = [
        Self::Misplaced,
        Self::Movable,
        Self::Ready,
        Self::Pinned,
        Self::Unknown,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Misplaced => "misplaced",
            Self::Unknown => "unknown",
            Self::Pinned => "pinned",
            Self::Movable => "movable",
            Self::Ready => "ready",
        }
    }
}

/// Where one of the workload's Pods runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) pod: String,
    pub(crate) node: String,
    /// The node's `kubernetes.io/arch`; `None` when the node is gone or unlabelled.
    pub(crate) architecture: Option<String>,
}

/// What is known of one workload.
#[derive(Clone, Debug, Default)]
pub(crate) struct Known {
    /// The architectures all its images support; `None` when some image is unknown.
    pub(crate) common: Option<Vec<String>>,
    /// Why images are unknown (`image: reason`).
    pub(crate) unknown: Vec<String>,
    /// Images with a single platform (`image (linux/amd64)`).
    pub(crate) single_architecture: Vec<String>,
    /// What the webhook would add to its Pods (tolerations, steering), as `review` shows it.
    pub(crate) additions: Vec<String>,
    /// Its Pods that are on a node and not finished.
    pub(crate) running: Vec<Placed>,
    /// The architectures of the tainted pools (`supported_architectures`): where a workload
    /// could move to.
    pub(crate) pools: Vec<String>,
}

/// The workload's status and the reasons for it.
pub(crate) fn judge(known: &Known) -> (Status, Vec<String>) {
    let Some(common) = &known.common else {
        return (Status::Unknown, known.unknown.clone());
    };
    let misplaced = misplaced(&known.running, common);
    if !misplaced.is_empty() {
        return (Status::Misplaced, misplaced);
    }
    if common.len() <= 1 {
        let mut reasons = vec![match common.first() {
            Some(only) => format!("images share only {only}"),
            None => "images share no architecture".to_owned(),
        }];
        reasons.extend(
            known
                .single_architecture
                .iter()
                .map(|image| format!("single-architecture image {image}")),
        );
        return (Status::Pinned, reasons);
    }
    let reachable: Vec<&String> = common.iter().filter(|a| known.pools.contains(a)).collect();
    if reachable.is_empty() {
        return (
            Status::Pinned,
            vec![format!(
                "images support {}: none is a tainted pool's (supported_architectures)",
                arch_list(common)
            )],
        );
    }
    let runs_on = runs_on(&known.running);
    if known.additions.is_empty() {
        return (
            Status::Ready,
            vec![format!(
                "images support {}; already tolerated and steered{runs_on}",
                arch_list(common)
            )],
        );
    }
    let already_there = known.running.iter().any(|p| {
        p.architecture
            .as_ref()
            .is_some_and(|a| reachable.contains(&a))
    });
    if already_there {
        // It runs on those pools already (placed by hand, a nodeName): nothing to move.
        return (
            Status::Ready,
            vec![format!(
                "images support {}{runs_on}; tolerable would still add {}",
                arch_list(common),
                known.additions.join("; ")
            )],
        );
    }
    (
        Status::Movable,
        vec![format!(
            "images support {}{runs_on}; tolerable would add {}",
            arch_list(common),
            known.additions.join("; ")
        )],
    )
}

/// `2 of 5 Pods on arm64 nodes: a on arm-1, b on arm-2; its images support amd64`: one reason
/// per architecture its images do not support, however many Pods run there.
fn misplaced(running: &[Placed], common: &[String]) -> Vec<String> {
    let mut wrong: BTreeMap<&str, Vec<&Placed>> = BTreeMap::new();
    for p in running {
        if let Some(arch) = p.architecture.as_deref() {
            if !common.iter().any(|c| c == arch) {
                wrong.entry(arch).or_default().push(p);
            }
        }
    }
    wrong
        .iter()
        .map(|(arch, pods)| {
            let named: Vec<String> = pods
                .iter()
                .take(PODS_NAMED)
                .map(|p| format!("{} on {}", p.pod, p.node))
                .collect();
            format!(
                "{} of {} Pod{} on {arch} nodes: {}; its images support {}",
                pods.len(),
                running.len(),
                if running.len() == 1 { "" } else { "s" },
                listed_and_more(&named, pods.len()),
                arch_list(common)
            )
        })
        .collect()
}

/// `a, b and c`, or `a, b, c and 47 more` when `total` is more than named.
fn listed_and_more(named: &[String], total: usize) -> String {
    match named {
        [] => String::new(),
        [only] if total == 1 => only.clone(),
        _ if total > named.len() => {
            format!("{} and {} more", named.join(", "), total - named.len())
        }
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

fn arch_list(architectures: &[String]) -> String {
    if architectures.is_empty() {
        "no common architecture".to_owned()
    } else {
        architectures.join(",")
    }
}

/// `; runs on amd64 (2 Pods)` — the architectures its Pods run on now.
fn runs_on(running: &[Placed]) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for p in running {
        *counts
            .entry(p.architecture.as_deref().unwrap_or("unknown"))
            .or_default() += 1;
    }
    if counts.is_empty() {
        return String::new();
    }
    let on: Vec<String> = counts
        .iter()
        .map(|(arch, n)| format!("{arch} ({n} Pod{})", if *n == 1 { "" } else { "s" }))
        .collect();
    format!("; runs on {}", on.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archs(list: &[&str]) -> Option<Vec<String>> {
        Some(list.iter().map(|s| (*s).to_owned()).collect())
    }

    fn on(pod: &str, arch: &str) -> Placed {
        Placed {
            pod: pod.into(),
            node: format!("{arch}-node"),
            architecture: Some(arch.into()),
        }
    }

    #[test]
    fn each_status_in_order() {
        let unknown = Known {
            common: None,
            unknown: vec!["app:1: not found".into()],
            running: vec![on("p", "s390x")],
            ..Known::default()
        };
        assert_eq!(
            judge(&unknown),
            (Status::Unknown, vec!["app:1: not found".into()])
        );

        let misplaced = Known {
            common: archs(&["amd64"]),
            running: vec![on("a", "amd64"), on("z", "s390x")],
            ..Known::default()
        };
        let (status, reasons) = judge(&misplaced);
        assert_eq!(status, Status::Misplaced);
        assert_eq!(
            reasons,
            ["1 of 2 Pods on s390x nodes: z on s390x-node; its images support amd64"]
        );

        let pinned = Known {
            common: archs(&["amd64"]),
            single_architecture: vec!["db:16 (linux/amd64)".into()],
            running: vec![on("a", "amd64")],
            ..Known::default()
        };
        assert_eq!(
            judge(&pinned),
            (
                Status::Pinned,
                vec![
                    "images share only amd64".into(),
                    "single-architecture image db:16 (linux/amd64)".into()
                ]
            )
        );

        let movable = Known {
            common: archs(&["amd64", "arm64"]),
            pools: vec!["arm64".into()],
            additions: vec!["toleration kubernetes.io/arch=arm64:NoSchedule".into()],
            running: vec![on("a", "amd64"), on("b", "amd64")],
            ..Known::default()
        };
        assert_eq!(
            judge(&movable),
            (
                Status::Movable,
                vec!["images support amd64,arm64; runs on amd64 (2 Pods); tolerable would add toleration kubernetes.io/arch=arm64:NoSchedule".into()]
            )
        );

        let ready = Known {
            additions: Vec::new(),
            ..movable.clone()
        };
        assert_eq!(judge(&ready).0, Status::Ready);
    }

    #[test]
    fn misplaced_pods_are_grouped_by_architecture_with_a_few_named() {
        let mut running: Vec<Placed> = (0..50).map(|i| on(&format!("p{i}"), "amd64")).collect();
        running.push(on("q", "s390x"));
        running.push(on("r", "arm64"));
        let known = Known {
            common: archs(&["arm64"]),
            running,
            ..Known::default()
        };
        let (status, reasons) = judge(&known);
        assert_eq!(status, Status::Misplaced);
        assert_eq!(
            reasons,
            [
                "50 of 52 Pods on amd64 nodes: p0 on amd64-node, p1 on amd64-node, p2 on amd64-node and 47 more; its images support arm64",
                "1 of 52 Pods on s390x nodes: q on s390x-node; its images support arm64",
            ]
        );
        assert_eq!(listed_and_more(&["a".into(), "b".into()], 2), "a and b");
    }

    #[test]
    fn already_on_the_tainted_pool_is_ready_and_no_reachable_pool_is_pinned() {
        let on_arm = Known {
            common: archs(&["amd64", "arm64"]),
            pools: vec!["arm64".into()],
            additions: vec!["toleration kubernetes.io/arch=arm64:NoSchedule".into()],
            running: vec![on("debug", "arm64")],
            ..Known::default()
        };
        let (status, reasons) = judge(&on_arm);
        assert_eq!(status, Status::Ready);
        assert!(reasons[0].contains("would still add"), "{reasons:?}");
        let no_pool = Known {
            common: archs(&["amd64", "ppc64le"]),
            pools: vec!["arm64".into()],
            additions: vec!["requires kubernetes.io/arch in (amd64,ppc64le)".into()],
            ..Known::default()
        };
        assert_eq!(judge(&no_pool).0, Status::Pinned);
    }

    #[test]
    fn a_pod_on_an_unknown_node_is_not_called_misplaced() {
        let known = Known {
            common: archs(&["amd64", "arm64"]),
            pools: vec!["arm64".into()],
            running: vec![Placed {
                pod: "p".into(),
                node: "gone".into(),
                architecture: None,
            }],
            ..Known::default()
        };
        assert_eq!(judge(&known).0, Status::Ready);
    }

    #[test]
    fn images_sharing_nothing_make_any_running_pod_misplaced_and_else_pinned() {
        let known = Known {
            common: archs(&[]),
            running: vec![on("p", "amd64")],
            ..Known::default()
        };
        assert_eq!(judge(&known).0, Status::Misplaced);
        let idle = Known {
            running: Vec::new(),
            ..known
        };
        assert_eq!(
            judge(&idle),
            (Status::Pinned, vec!["images share no architecture".into()])
        );
    }
}
