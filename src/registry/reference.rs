//! Image references: parse what a Pod spec says (`nginx`, `ghcr.io/o/app:1.2@sha256:…`) into the
//! registry, repository and tag or digest to ask for. Pure code; follows the grammar of the
//! distribution project's `reference` package and Docker's normalisation rules.

use std::fmt;

/// The registry name Docker Hub images are normalised to.
pub(crate) const DOCKER_HUB: &str = "docker.io";
/// The host that actually serves Docker Hub's registry API.
pub(crate) const DOCKER_HUB_API_HOST: &str = "registry-1.docker.io";
/// The registry name for `host` as images and credentials key it: Docker Hub's other names
/// (`index.docker.io`, its API host) are [`DOCKER_HUB`]; every other host is itself.
pub(crate) fn canonical_registry(host: &str) -> &str {
    match host {
        "index.docker.io" | DOCKER_HUB_API_HOST => DOCKER_HUB,
        _ => host,
    }
}

/// Longest repository name the distribution grammar allows.
const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

/// A fully qualified image reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageReference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

/// Why an image reference could not be parsed. Always names the reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct ReferenceError {
    pub(crate) reference: String,
    pub(crate) reason: &'static str,
}

impl ImageReference {
    /// Parses and normalises `image` the way the kubelet and Docker read it.
    pub fn parse(image: &str) -> Result<Self, ReferenceError> {
        let fail = |reason| ReferenceError {
            reference: image.to_owned(),
            reason,
        };
        if image.is_empty() {
            return Err(fail("empty reference"));
        }
        if image.trim() != image || image.contains(char::is_whitespace) {
            return Err(fail("contains whitespace"));
        }

        // `name[:tag][@digest]`: the digest is everything after the first '@'.
        let (name_and_tag, digest) = match image.split_once('@') {
            Some((rest, digest)) => (rest, Some(parse_digest(digest).map_err(fail)?)),
            None => (image, None),
        };
        // A tag is after the last ':' that follows the last '/', so `host:5000/app` has no tag.
        let last_slash = name_and_tag.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name_and_tag[last_slash..].rfind(':') {
            Some(i) => {
                let split = last_slash + i;
                let tag = &name_and_tag[split + 1..];
                validate_tag(tag).map_err(fail)?;
                (&name_and_tag[..split], Some(tag.to_owned()))
            }
            None => (name_and_tag, None),
        };
        if name.is_empty() {
            return Err(fail("missing repository name"));
        }

        let (registry, path) = split_registry(name);
        let registry = match registry {
            Some(host) => {
                validate_host(host).map_err(fail)?;
                canonical_registry(host).to_owned()
            }
            None => DOCKER_HUB.to_owned(),
        };
        let repository = if registry == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path.to_owned()
        };
        validate_repository(&repository).map_err(fail)?;
        if registry.len() + 1 + repository.len() > MAX_NAME_LEN {
            return Err(fail("name longer than 255 characters"));
        }

        let tag = match (tag, &digest) {
            (None, None) => Some("latest".to_owned()),
            (tag, _) => tag,
        };
        Ok(Self {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The registry's name as images spell it (`docker.io`, `ghcr.io`, `localhost:5000`).
    pub(crate) fn registry(&self) -> &str {
        &self.registry
    }

    /// The host to send registry API requests to (`registry-1.docker.io` for Docker Hub).
    pub(crate) fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API_HOST
        } else {
            &self.registry
        }
    }

    pub(crate) fn repository(&self) -> &str {
        &self.repository
    }

    #[cfg(test)]
    pub(crate) fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub(crate) fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// What goes after `/manifests/` in the request: the digest wins over the tag, because the
    /// kubelet pulls by digest when one is given.
    pub(crate) fn manifest_reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .expect("a reference always has a tag or a digest")
    }

    /// Whether the answer can never change (pinned by digest).
    pub(crate) fn is_immutable(&self) -> bool {
        self.digest.is_some()
    }

    /// The same repository pinned to `digest` (no tag): where answers by digest are kept.
    pub(crate) fn with_digest(&self, digest: &str) -> Self {
        Self {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: None,
            digest: Some(digest.to_owned()),
        }
    }
}

/// The normalised form `registry/repository:tag@digest` (the cache key's form too).
impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Splits off the registry host: the first path component is a host when it contains `.` or `:`,
/// is `localhost`, or has upper-case letters (Docker's rule; repositories are lower-case).
fn split_registry(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (Some(first), rest)
        }
        _ => (None, name),
    }
}

pub(crate) fn validate_host(host: &str) -> Result<(), &'static str> {
    // IPv6 literal in brackets, optionally with a port.
    let (hostname, port) = if let Some(rest) = host.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or("unterminated IPv6 host")?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("invalid IPv6 host");
        }
        match after {
            "" => return Ok(()),
            _ => (
                "",
                Some(after.strip_prefix(':').ok_or("invalid registry host")?),
            ),
        }
    } else {
        match host.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host, None),
        }
    };
    if let Some(port) = port {
        if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err("invalid registry port");
        }
        if port.parse::<u32>().map_or(true, |p| p == 0 || p > 65535) {
            return Err("registry port out of range");
        }
    }
    if host.starts_with('[') {
        return Ok(());
    }
    if hostname.is_empty() {
        return Err("empty registry host");
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if !hostname.split('.').all(label_ok) {
        return Err("invalid registry host");
    }
    Ok(())
}

/// Repository path components: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`, joined by `/`.
fn validate_repository(repository: &str) -> Result<(), &'static str> {
    for component in repository.split('/') {
        if component.is_empty() {
            return Err("empty path component in repository name");
        }
        let bytes = component.as_bytes();
        let is_alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if !is_alnum(bytes[0]) || !is_alnum(bytes[bytes.len() - 1]) {
            return Err("repository name must be lower-case letters, digits and separators");
        }
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if is_alnum(b) {
                i += 1;
                continue;
            }
            // A separator run: '.', '_', '__', or any number of '-'.
            let start = i;
            while i < bytes.len() && !is_alnum(bytes[i]) {
                i += 1;
            }
            let sep = &component[start..i];
            let valid = matches!(sep, "." | "_" | "__") || sep.bytes().all(|c| c == b'-');
            if !valid {
                return Err("repository name must be lower-case letters, digits and separators");
            }
        }
    }
    Ok(())
}

/// Tags: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn validate_tag(tag: &str) -> Result<(), &'static str> {
    let bytes = tag.as_bytes();
    if bytes.is_empty() {
        return Err("empty tag");
    }
    if bytes.len() > MAX_TAG_LEN {
        return Err("tag longer than 128 characters");
    }
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    if !word(bytes[0]) || !bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-') {
        return Err("invalid tag");
    }
    Ok(())
}

fn parse_digest(digest: &str) -> Result<String, &'static str> {
    let (algorithm, hex) = digest
        .split_once(':')
        .ok_or("digest must be algorithm:hex")?;
    let expected_len = match algorithm {
        "sha256" => 64,
        "sha512" => 128,
        _ => return Err("unsupported digest algorithm (sha256 or sha512)"),
    };
    if hex.len() != expected_len
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err("digest has the wrong length or is not lower-case hex");
    }
    Ok(digest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// Input, normalized, API host, manifest reference.
    const NAME_CASES: &[(&str, &str, &str, &str)] = &[
        (
            "nginx",
            "docker.io/library/nginx:latest",
            "registry-1.docker.io",
            "latest",
        ),
        (
            "nginx:1.25",
            "docker.io/library/nginx:1.25",
            "registry-1.docker.io",
            "1.25",
        ),
        (
            "library/nginx",
            "docker.io/library/nginx:latest",
            "registry-1.docker.io",
            "latest",
        ),
        (
            "docker.io/nginx",
            "docker.io/library/nginx:latest",
            "registry-1.docker.io",
            "latest",
        ),
        (
            "index.docker.io/library/nginx",
            "docker.io/library/nginx:latest",
            "registry-1.docker.io",
            "latest",
        ),
        (
            "registry-1.docker.io/bitnami/redis:7",
            "docker.io/bitnami/redis:7",
            "registry-1.docker.io",
            "7",
        ),
        (
            "bitnami/redis",
            "docker.io/bitnami/redis:latest",
            "registry-1.docker.io",
            "latest",
        ),
        (
            "ghcr.io/owner/app",
            "ghcr.io/owner/app:latest",
            "ghcr.io",
            "latest",
        ),
        ("ghcr.io/app", "ghcr.io/app:latest", "ghcr.io", "latest"),
        (
            "registry.example.com:5000/team/app:v1",
            "registry.example.com:5000/team/app:v1",
            "registry.example.com:5000",
            "v1",
        ),
        (
            "localhost/app",
            "localhost/app:latest",
            "localhost",
            "latest",
        ),
        (
            "localhost:5000/app:dev",
            "localhost:5000/app:dev",
            "localhost:5000",
            "dev",
        ),
        (
            "127.0.0.1:5000/a/b/c:1",
            "127.0.0.1:5000/a/b/c:1",
            "127.0.0.1:5000",
            "1",
        ),
        (
            "[::1]:5000/app",
            "[::1]:5000/app:latest",
            "[::1]:5000",
            "latest",
        ),
        ("Registry/app", "Registry/app:latest", "Registry", "latest"),
        (
            "my-repo/a.b__c--d",
            "docker.io/my-repo/a.b__c--d:latest",
            "registry-1.docker.io",
            "latest",
        ),
    ];

    #[test]
    fn normalises_like_docker() {
        for (input, normalized, host, manifest_ref) in NAME_CASES {
            let r = ImageReference::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(r.to_string(), *normalized, "{input}");
            assert_eq!(r.to_string(), *normalized, "{input}");
            assert_eq!(r.api_host(), *host, "{input}");
            assert_eq!(r.manifest_reference(), *manifest_ref, "{input}");
        }
    }

    #[test]
    fn a_digest_wins_over_the_tag() {
        let digest_only = format!("docker.io/library/nginx@{D}");
        let both = format!("docker.io/library/nginx:1.25@{D}");
        let r = ImageReference::parse(&format!("nginx@{D}")).unwrap();
        assert_eq!(r.to_string(), digest_only);
        assert_eq!(r.to_string(), digest_only);
        assert_eq!(r.tag(), None);
        assert_eq!(r.manifest_reference(), D);
        assert!(r.is_immutable());

        // name:tag@digest: the digest wins, the tag is kept for display.
        let r = ImageReference::parse(&format!("nginx:1.25@{D}")).unwrap();
        assert_eq!(r.to_string(), both);
        assert_eq!(r.to_string(), both);
        assert_eq!(r.manifest_reference(), D);

        let r = ImageReference::parse(&format!("localhost:5000/app@{D}")).unwrap();
        assert_eq!(r.registry(), "localhost:5000");
        assert_eq!(r.repository(), "app");
        assert_eq!(r.digest(), Some(D));
    }

    #[test]
    fn rejects_invalid_references_naming_them() {
        let cases: &[(&str, &str)] = &[
            ("", "empty reference"),
            ("Nginx", "repository name must be"),
            ("nginx:", "empty tag"),
            ("nginx:-bad", "invalid tag"),
            ("nginx@sha256:abc", "wrong length"),
            ("nginx@md5:0123", "unsupported digest algorithm"),
            ("nginx@", "digest must be"),
            ("ghcr.io//app", "empty path component"),
            ("ghcr.io/app/", "empty path component"),
            ("host:99999/app", "port out of range"),
            ("host:abc/app", "invalid registry port"),
            ("-bad.io/app", "invalid registry host"),
            ("nginx latest", "whitespace"),
            ("app_/x", "repository name must be"),
            ("a...b", "repository name must be"),
        ];
        for (input, reason) in cases {
            let err = ImageReference::parse(input).expect_err(input);
            assert_eq!(err.reference, *input);
            assert!(
                err.to_string().contains(reason),
                "{input}: {err} should mention {reason}"
            );
            assert!(err.to_string().contains(&format!("{input:?}")));
        }
        let long = format!("ghcr.io/{}", "a".repeat(300));
        assert!(ImageReference::parse(&long).is_err());
        let long_tag = format!("app:{}", "a".repeat(129));
        assert!(ImageReference::parse(&long_tag).is_err());
    }
}
