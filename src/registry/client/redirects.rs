//! Where a registry may send tolerable: redirects only as the distribution spec needs them,
//! and plain http only to a host listed in `insecure_registries`.

use std::collections::HashSet;
use std::sync::Arc;

use super::AccessRules;

/// Registries redirect blob (and some manifest) GETs to a storage host or CDN, once; a longer
/// chain is a loop or a hostile registry walking tolerable around a network.
const MAX_REDIRECTS: usize = 3;
/// Whether `url` (plain http) names a host listed in `insecure_registries`: as `host:port`, or
/// as `host` alone for port 80.
pub(super) fn listed_insecure(insecure: &HashSet<String>, url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let port = url.port_or_known_default().unwrap_or_default();
    insecure.contains(&format!("{host}:{port}")) || (port == 80 && insecure.contains(&host))
}

/// Why a redirect must not be followed: reqwest hands it back as the request's error.
#[derive(Debug)]
pub(super) struct RedirectRefused(pub(super) String);

impl std::fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedirectRefused {}

/// `/v2/<name>/manifests/<reference>` or `/v2/<name>/blobs/<digest>`: the requests the OCI
/// distribution spec lets a registry redirect. (A realm URL shaped like one gains nothing: its
/// redirects meet the same rules.)
fn is_content_path(path: &str) -> bool {
    path.strip_prefix("/v2/").is_some_and(|rest| {
        rest.rsplit_once('/').is_some_and(|(front, reference)| {
            !reference.is_empty()
                && front
                    .strip_suffix("/manifests")
                    .or_else(|| front.strip_suffix("/blobs"))
                    .is_some_and(|repository| !repository.is_empty())
        })
    })
}

/// Redirects are followed only as the distribution spec needs them (manifest and blob GETs),
/// at most [`MAX_REDIRECTS`] hops, to https (plain http only for a host in
/// `insecure_registries`, and never after https), and only to hosts the access rules allow.
/// reqwest drops `Authorization` whenever the host, port or scheme changes, so credentials
/// never follow a redirect to another host.
pub(super) fn redirect_policy(
    access: Arc<AccessRules>,
    insecure: Arc<HashSet<String>>,
) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        let next = attempt.url();
        let previous = attempt.previous();
        let refusal = if previous.len() > MAX_REDIRECTS {
            Some(format!("more than {MAX_REDIRECTS} redirects"))
        } else if !previous.first().is_some_and(|u| is_content_path(u.path())) {
            Some("a redirect of a token request".to_owned())
        } else {
            match next.scheme() {
                "https" => None,
                "http"
                    if listed_insecure(&insecure, next)
                        && previous.iter().all(|u| u.scheme() == "http") =>
                {
                    None
                }
                "http" => Some("a redirect to plain http".to_owned()),
                _ => Some("a redirect to another protocol".to_owned()),
            }
            .or_else(|| {
                access
                    .check_url(next)
                    .err()
                    .map(|denied| format!("a redirect to a host that is {denied}"))
            })
        };
        match refusal {
            None => attempt.follow(),
            Some(why) => {
                tracing::info!(
                    from = ?previous.last().map(reqwest::Url::as_str), to = ?next.as_str(), %why,
                    "registry redirect refused"
                );
                attempt.error(RedirectRefused(format!("refused {why}")))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_manifest_and_blob_requests_are_redirected() {
        for path in [
            "/v2/app/manifests/v1",
            "/v2/org/app/blobs/sha256:abc",
            "/v2/manifests/manifests/v1",
        ] {
            assert!(is_content_path(path), "{path}");
        }
        for path in [
            "/token",
            "/v2/",
            "/v2/manifests/v1",
            "/v2/app/manifests/",
            "/v2/app/tags/list",
            "/latest/meta-data/",
        ] {
            assert!(!is_content_path(path), "{path}");
        }
    }

    #[test]
    fn insecure_registries_ignore_case_and_name_the_port() {
        let insecure: HashSet<String> =
            ["localhost:5000", "plain.example"].map(String::from).into();
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(listed_insecure(
            &insecure,
            &url("http://LocalHost:5000/token")
        ));
        assert!(listed_insecure(
            &insecure,
            &url("http://plain.example/token")
        ));
        assert!(listed_insecure(
            &insecure,
            &url("http://plain.example:80/token")
        ));
        assert!(!listed_insecure(
            &insecure,
            &url("http://localhost:5001/token")
        ));
        assert!(!listed_insecure(
            &insecure,
            &url("http://plain.example:8080/token")
        ));
    }
}
