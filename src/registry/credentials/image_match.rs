//! The kubelet's image matching rules, for credential provider plugins' `matchImages` and the
//! keys of their `auth` answers (pure: no I/O).
//!
//! An image (`registry[:port]/path`, no scheme) matches a pattern when, as the kubelet's
//! `URLsMatch` decides:
//! - both hosts have the same number of dot-separated labels, and each label matches the
//!   pattern's label as a glob (`*`, `?`, `[a-z]`, `[^…]`, `\c`: Go's `filepath.Match`), so one
//!   `*` stands for one label (`*.azurecr.io` matches `team.azurecr.io`, not `azurecr.io` nor
//!   `a.b.azurecr.io`) or part of one (`*-docker.pkg.dev`);
//! - the ports are equal (a pattern without a port matches only images without one);
//! - the pattern's path is a prefix of the image's path (`registry.io:8080/path` matches
//!   `registry.io:8080/path/app`).

use std::fmt;

/// One `matchImages` entry (or `auth` key), parsed once.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ImagePattern {
    text: String,
    labels: Vec<Glob>,
    port: Option<String>,
    path: String,
}

impl fmt::Debug for ImagePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImagePattern({:?})", self.text)
    }
}

impl fmt::Display for ImagePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl ImagePattern {
    /// A `matchImages` entry: `host[:port][/path]`, globs in the host only.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text.contains("://") {
            return Err(format!(
                "{text:?}: no scheme is allowed (write the host alone)"
            ));
        }
        let (host, port, path) = split(text);
        if host.is_empty() {
            return Err(format!("{text:?}: no host"));
        }
        if let Some(port) = port {
            if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{text:?}: the port must be a number"));
            }
        }
        let labels = host
            .split('.')
            .map(|label| Glob::parse(&label.to_ascii_lowercase()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| format!("{text:?}: {why}"))?;
        Ok(Self {
            text: text.to_owned(),
            labels,
            port: port.map(str::to_owned),
            path: path.to_owned(),
        })
    }

    /// A key of a plugin's `auth` answer, or of a Docker config, read as the kubelet's keyring
    /// reads it: a scheme is dropped, and so is a leading `/v1/` or `/v2/` of the path.
    pub(crate) fn parse_auth_key(key: &str) -> Result<Self, String> {
        let key = key
            .trim()
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let (host, port, path) = split(key);
        let path = ["/v1/", "/v2/"]
            .iter()
            .find_map(|p| path.strip_prefix(&p[..3]).filter(|_| path.starts_with(p)))
            .unwrap_or(path);
        let path = if path == "/" { "" } else { path };
        let text = match port {
            Some(port) => format!("{host}:{port}{path}"),
            None => format!("{host}{path}"),
        };
        Self::parse(&text)
    }

    /// Whether `image` (`registry[:port]/repository`, as the kubelet names the image it pulls:
    /// no tag, no digest) matches.
    pub(crate) fn matches(&self, image: &str) -> bool {
        let (host, port, path) = split(image);
        if port != self.port.as_deref() {
            return false;
        }
        let host = host.to_ascii_lowercase();
        let labels: Vec<&str> = host.split('.').collect();
        labels.len() == self.labels.len()
            && self
                .labels
                .iter()
                .zip(&labels)
                .all(|(glob, label)| glob.matches(label))
            && path.starts_with(&self.path)
    }
}

/// `host`, `port` (after a `:` in the host part) and the path (from the first `/`, kept).
fn split(text: &str) -> (&str, Option<&str>, &str) {
    let (authority, path) = match text.find('/') {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port), path),
        None => (authority, None, path),
    }
}

/// One label's glob, as Go's `filepath.Match` reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Glob(Vec<Token>);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// `*`: any run of characters, the empty one included.
    Any,
    /// `?`: one character.
    One,
    /// `[…]` or `[^…]`.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Literal(char),
}

impl Glob {
    fn parse(text: &str) -> Result<Self, String> {
        let mut chars = text.chars();
        let mut tokens = Vec::new();
        while let Some(c) = chars.next() {
            tokens.push(match c {
                '*' => Token::Any,
                '?' => Token::One,
                '\\' => Token::Literal(chars.next().ok_or("a glob ends with \\")?),
                '[' => class(&mut chars)?,
                c => Token::Literal(c),
            });
        }
        Ok(Self(tokens))
    }

    fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        matches_from(&self.0, &text)
    }
}

/// A character class after its `[`, up to and with its `]` (`-` and `]` only escaped, or `]`
/// closing a class that has a range).
fn class(chars: &mut std::str::Chars<'_>) -> Result<Token, String> {
    let unclosed = || "a glob has an unclosed [".to_owned();
    let mut negated = false;
    let mut ranges = Vec::new();
    let mut c = chars.next().ok_or_else(unclosed)?;
    if c == '^' {
        negated = true;
        c = chars.next().ok_or_else(unclosed)?;
    }
    loop {
        if c == ']' && !ranges.is_empty() {
            return Ok(Token::Class { negated, ranges });
        }
        let lo = class_char(c, chars)?;
        c = chars.next().ok_or_else(unclosed)?;
        let mut hi = lo;
        if c == '-' {
            let next = chars.next().ok_or_else(unclosed)?;
            hi = class_char(next, chars)?;
            if hi < lo {
                return Err(format!("a glob has a reversed range {lo}-{hi}"));
            }
            c = chars.next().ok_or_else(unclosed)?;
        }
        ranges.push((lo, hi));
    }
}

/// One character of a class: `\c` is `c`; a bare `-` or `]` is out of place.
fn class_char(c: char, chars: &mut std::str::Chars<'_>) -> Result<char, String> {
    match c {
        '\\' => chars
            .next()
            .ok_or_else(|| "a glob has an unclosed [".to_owned()),
        '-' | ']' => Err(format!(
            "a glob has a {c} out of place in a character class"
        )),
        c => Ok(c),
    }
}

fn matches_from(tokens: &[Token], text: &[char]) -> bool {
    let Some((token, rest)) = tokens.split_first() else {
        return text.is_empty();
    };
    match token {
        Token::Any => (0..=text.len()).any(|skip| matches_from(rest, &text[skip..])),
        _ => match text.split_first() {
            Some((c, text_rest)) => token_matches(token, *c) && matches_from(rest, text_rest),
            None => false,
        },
    }
}

fn token_matches(token: &Token, c: char) -> bool {
    match token {
        Token::Any | Token::One => true,
        Token::Literal(l) => *l == c,
        Token::Class { negated, ranges } => {
            ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
        }
    }
}

/// The patterns among `keys` that match `image`, best first: the kubelet's keyring order
/// (reverse lexical order of the keys, so `quay.io/coreos` before `quay.io`).
pub(crate) fn best_first<'a, T>(image: &str, keys: &'a [(ImagePattern, T)]) -> Vec<&'a T> {
    let mut matching: Vec<&(ImagePattern, T)> =
        keys.iter().filter(|(p, _)| p.matches(image)).collect();
    matching.sort_by(|a, b| b.0.text.cmp(&a.0.text));
    matching.into_iter().map(|(_, value)| value).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, image: &str) -> bool {
        ImagePattern::parse(pattern).unwrap().matches(image)
    }

    /// The examples of the kubelet's documentation (Configure a kubelet image credential
    /// provider; the CredentialProviderConfig reference).
    #[test]
    fn the_kubelet_documentations_examples() {
        assert!(!matches("*.kubernetes.io", "kubernetes.io"));
        assert!(matches("*.kubernetes.io", "abc.kubernetes.io"));
        assert!(!matches("*.*.kubernetes.io", "abc.kubernetes.io"));
        assert!(matches("*.*.kubernetes.io", "abc.def.kubernetes.io"));
        assert!(matches("prefix.*.io", "prefix.kubernetes.io"));
        assert!(matches("*-good.kubernetes.io", "prefix-good.kubernetes.io"));
        assert!(!matches("*-good.kubernetes.io", "prefix-bad.kubernetes.io"));
        // A glob is one label: *.io matches no name of three labels.
        assert!(!matches("*.io", "k8s.kubernetes.io"));
        assert!(matches("k8s.*", "k8s.io"));
        assert!(matches("app*.k8s.io", "app1.k8s.io"));
        assert!(!matches("app*.k8s.io", "web.k8s.io"));
        // The reference's example values.
        let ecr = "123456789.dkr.ecr.us-east-1.amazonaws.com";
        assert!(matches(ecr, &format!("{ecr}/app")));
        assert!(!matches(
            ecr,
            "987654321.dkr.ecr.us-east-1.amazonaws.com/app"
        ));
        assert!(matches("*.azurecr.io", "myteam.azurecr.io/web"));
        assert!(!matches("*.azurecr.io", "azurecr.io/web"));
        assert!(matches("gcr.io", "gcr.io/project/image"));
        assert!(!matches("gcr.io", "eu.gcr.io/project/image"));
        assert!(matches("*.*.registry.io", "a.b.registry.io/x"));
        assert!(!matches("*.*.registry.io", "a.registry.io/x"));
        assert!(matches(
            "registry.io:8080/path",
            "registry.io:8080/path/app"
        ));
        assert!(!matches(
            "registry.io:8080/path",
            "registry.io:8080/other/app"
        ));
        assert!(!matches("registry.io:8080/path", "registry.io/path/app"));
    }

    /// The cloud providers' own patterns, as their node configurations ship them.
    #[test]
    fn cloud_registries() {
        let ecr = "*.dkr.ecr.*.amazonaws.com";
        assert!(matches(
            ecr,
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com/app"
        ));
        assert!(!matches(ecr, "public.ecr.aws/app"));
        assert!(!matches(
            ecr,
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com.evil.example/app"
        ));
        assert!(matches(
            "*.dkr.ecr.*.amazonaws.com.cn",
            "1.dkr.ecr.cn-north-1.amazonaws.com.cn/a"
        ));
        assert!(matches(
            "*-docker.pkg.dev",
            "europe-west1-docker.pkg.dev/p/r/i"
        ));
        assert!(!matches("*-docker.pkg.dev", "docker.pkg.dev/p/r/i"));
        assert!(matches("*.pkg.dev", "us-docker.pkg.dev/p/r/i"));
        assert!(matches("*.azurecr.io", "Team.AzureCR.io/web"));
    }

    #[test]
    fn ports_must_be_equal() {
        assert!(matches("localhost:5000", "localhost:5000/app"));
        assert!(!matches("localhost:5000", "localhost:5001/app"));
        assert!(!matches("localhost", "localhost:5000/app"));
        assert!(!matches("localhost:5000", "localhost/app"));
        assert!(matches("127.0.0.1:5000", "127.0.0.1:5000/app"));
        assert!(matches("*.*.*.*:5000", "127.0.0.1:5000/app"));
    }

    #[test]
    fn paths_are_prefixes() {
        assert!(matches("quay.io/coreos", "quay.io/coreos/etcd"));
        assert!(!matches("quay.io/coreos", "quay.io/other/etcd"));
        assert!(matches("quay.io", "quay.io/other/etcd"));
        // A plain string prefix, as the kubelet compares.
        assert!(matches("quay.io/core", "quay.io/coreos/etcd"));
    }

    #[test]
    fn globs_as_go_reads_them() {
        assert!(matches("reg[0-9].example", "reg1.example/a"));
        assert!(!matches("reg[0-9].example", "regx.example/a"));
        assert!(matches("reg[^0-9].example", "regx.example/a"));
        assert!(matches("r?g.example", "rag.example/a"));
        assert!(!matches("r?g.example", "rg.example/a"));
        assert!(matches(r"a\*.example", "a*.example/x"));
        assert!(!matches(r"a\*.example", "ab.example/x"));
        for bad in [
            "reg[0-9.example",
            r"reg\",
            "reg[].example",
            "reg[9-0].example",
            "a:b",
            "https://gcr.io",
            "",
        ] {
            assert!(ImagePattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn auth_keys_as_the_kubelets_keyring_reads_them() {
        let key = |k: &str| ImagePattern::parse_auth_key(k).unwrap().to_string();
        assert_eq!(key("https://gcr.io/v2/"), "gcr.io");
        assert_eq!(key("https://index.docker.io/v1/"), "index.docker.io");
        assert_eq!(key("quay.io/coreos"), "quay.io/coreos");
        assert_eq!(key("http://localhost:5000"), "localhost:5000");
        let keys: Vec<(ImagePattern, &str)> = ["quay.io", "quay.io/coreos", "*.io", "gcr.io"]
            .iter()
            .map(|k| (ImagePattern::parse_auth_key(k).unwrap(), *k))
            .collect();
        assert_eq!(
            best_first("quay.io/coreos/etcd", &keys),
            [&"quay.io/coreos", &"quay.io", &"*.io"]
        );
        assert!(best_first("ghcr.io.example/x", &keys).is_empty());
    }
}
