//! Which node architectures run a Pod's images: a node runs an image when containerd's default
//! platform matcher on it (`platforms.Only`, what the kubelet's CRI pull uses) accepts one of
//! the image's platforms — an amd64 node pulls a `linux/386` image, an arm64 node an arm one
//! where its CPU runs 32-bit code — so the Pod is placed by node architectures (the names
//! `kubernetes.io/arch` carries), never by names only images use.

use super::explain;
use super::facts::ImageFact;
use super::platform::{node_runs, Runs};
use super::{NodePools, Policy};

/// Architecture names images use that no Kubernetes node carries: the kubelet is not built for
/// 386, so a `linux/386` image runs on amd64 nodes (`amd64_runs_386`) or nowhere.
const IMAGE_ONLY_ARCHITECTURES: &[&str] = &["386"];

/// What the decision learns of where the images run.
#[derive(Debug, Default)]
pub struct Common {
    /// The node architectures that run every image, sorted.
    pub architectures: Vec<String>,
    /// The images, as the summary names them.
    pub described: String,
    /// Where a node architecture pulls other than its own platform:
    /// `amd64 pulls linux/386 for app:1`.
    pub pulls: Vec<String>,
    /// Images that run on a node architecture only if its CPUs meet a variant nothing says
    /// they meet.
    pub warnings: Vec<String>,
    /// The node architectures considered: those the cluster has or may add (and, without the
    /// node watch, those the images name).
    pub candidates: Vec<String>,
}

/// The node architectures every image runs on under `os`, and the images described for the
/// summary. An artifact without a platform (a Helm chart or model weights in an image volume)
/// runs anywhere and does not narrow the set; when only artifacts remain, every architecture
/// that can appear is common (tolerated where supported, never steered).
pub fn common_architectures(
    os: &str,
    known: &[(&str, &ImageFact)],
    policy: &Policy,
    pools: Option<&NodePools>,
) -> Common {
    let mut common = Common::default();
    // Sized for the usual text (a platform is ~12 bytes and a comma): grown piece by piece it
    // was reallocated once per image (callgrind).
    let room: usize = known
        .iter()
        .map(|(image, found)| image.len() + 4 + 16 * found.platforms.len())
        .sum();
    common.described.reserve(room);
    for (image, found) in known {
        explain::describe_image(&mut common.described, image, found);
    }
    let images: Vec<(&str, &ImageFact)> = known
        .iter()
        .filter(|(_, found)| found.artifact.is_none())
        .copied()
        .collect();
    let candidates = candidates(os, &images, policy, pools);
    if images.is_empty() {
        common.architectures = candidates.iter().map(|a| (*a).to_owned()).collect();
    }
    for arch in candidates.iter().filter(|_| !images.is_empty()) {
        let runtime = policy.runtime_for(arch);
        let (mut pulls, mut warnings) = (Vec::new(), Vec::new());
        let runs_all = images.iter().all(|(image, found)| {
            match node_runs(os, arch, &found.platforms, &runtime) {
                Runs::Pulls { platform, own } => {
                    if !own {
                        pulls.push(explain::pulls(arch, &platform, image));
                    }
                    true
                }
                Runs::Unverified(platform) => {
                    pulls.push(explain::pulls(arch, &platform, image));
                    warnings.push(explain::variant_unknown(image, arch, &platform));
                    true
                }
                Runs::No => false,
            }
        });
        if runs_all {
            common.architectures.push((*arch).to_owned());
            common.pulls.append(&mut pulls);
            common.warnings.append(&mut warnings);
        }
    }
    common.candidates = candidates.into_iter().map(str::to_owned).collect();
    common
}

/// The node architectures a Pod may be placed on: those the cluster has (the node watch) or may
/// add (`supported_architectures`, `default_architectures`: a pool scaling from zero); without
/// the node watch, also each architecture the images name on `os` that a node can carry.
/// Borrowed: this runs on every admission. Sorted and each once, as a set holds them, but in a
/// `Vec`: there are a handful, and a `BTreeSet`'s nodes cost ~1k instructions an admission.
fn candidates<'a>(
    os: &str,
    images: &[(&str, &'a ImageFact)],
    policy: &'a Policy,
    pools: Option<&'a NodePools>,
) -> Vec<&'a str> {
    let mut out: Vec<&str> = policy
        .possible_architectures(pools)
        .map(String::as_str)
        .collect();
    if pools.is_none() {
        let named = images
            .iter()
            .flat_map(|(_, found)| &found.platforms)
            .filter(|p| *p.os == *os && !IMAGE_ONLY_ARCHITECTURES.contains(&&*p.architecture))
            .map(|p| &*p.architecture);
        out.extend(named);
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests;
