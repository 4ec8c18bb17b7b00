//! Which hosts tolerable may contact: the operator's `registry_allowlist` and
//! `registry_denylist`, applied to image hosts, mirrors, token realms and redirect targets.
//!
//! Any Pod can name any `host:port` as its image's registry, and a registry answers with URLs of
//! its own choosing (token realms, redirects). Without a rule, tolerable would contact whatever
//! a Pod author or a hostile registry points it at — the cloud metadata service included.
//!
//! Rules are host names (`registry.example.com`, any port), `host:port` (that port only),
//! wildcards (`*.example.com`: a leading `*` stands for one or more labels; `*.dkr.ecr.*.amazonaws.com`:
//! an inner `*` for exactly one), addresses and CIDR networks (`10.0.0.0/8`, `fd00::/8`; every
//! port), and addresses with a port (`10.0.0.5:5000`, `[fd00::5]:5000`; that port only).
//! Matching ignores case.
//!
//! An address with a port judges hosts written as that address (an image `10.0.0.5:5000/app`,
//! a realm, a redirect). A name's addresses are judged when it is resolved, where the port is
//! not known: there an allow entry with a port allows nothing (allow the name itself, with its
//! port), and a deny entry with a port denies the address on every port.
//!
//! A name is checked twice: as written, before any request ([`AccessRules::check_url`]), and by
//! the addresses it resolves to, at connect time ([`FilteringResolver`]), so a name pointing at
//! 169.254.169.254 is refused like the address itself. IP-literal hosts never reach a resolver;
//! they are checked as addresses up front.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Denied whatever `registry_denylist` says (cloud metadata endpoints are never a registry),
/// unless `registry_allowlist` names an address or network inside them.
pub const LINK_LOCAL: [&str; 2] = ["169.254.0.0/16", "fd00:ec2::254/128"];

/// One address or network (an address is a /32 or /128), on every port or (an address only)
/// on one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
    port: Option<u16>,
}

impl Net {
    /// `10.0.0.5:5000` or `[fd00::5]:5000` (and `[fd00::5]`); `None` when `text` is not an
    /// address written with a port or brackets.
    fn parse_with_port(text: &str) -> Option<Result<Self, String>> {
        let (addr, port) = match text.strip_prefix('[') {
            Some(bracketed) => {
                let Some((addr, rest)) = bracketed.split_once(']') else {
                    return Some(Err("an IPv6 address in brackets lacks its `]`".to_owned()));
                };
                match rest {
                    "" => (addr, None),
                    _ => match rest.strip_prefix(':') {
                        Some(port) => (addr, Some(port)),
                        None => return Some(Err(format!("{rest:?} after `]` is not `:port`"))),
                    },
                }
            }
            None => {
                let (addr, port) = text.rsplit_once(':')?;
                match addr.split_once('/') {
                    Some((network, _)) if network.parse::<Ipv4Addr>().is_ok() => {
                        return Some(Err(
                            "a network applies to every port: give a port to an address only"
                                .to_owned(),
                        ))
                    }
                    _ => (addr.parse::<Ipv4Addr>().ok().map(|_| addr)?, Some(port)),
                }
            }
        };
        if addr.contains('/') {
            return Some(Err(
                "a network applies to every port: give a port to an address only".to_owned(),
            ));
        }
        let Ok(ip) = addr
            .parse::<Ipv6Addr>()
            .map(IpAddr::V6)
            .or_else(|_| match port {
                // `[10.0.0.5]:5000` is not how an IPv4 address is written.
                Some(_) if text.starts_with('[') => Err(()),
                _ => addr.parse::<Ipv4Addr>().map(IpAddr::V4).map_err(|_| ()),
            })
        else {
            return Some(Err(format!("{addr:?} is not an IP address")));
        };
        let port = match port.map(|p| p.parse::<u16>().ok().filter(|p| *p > 0).ok_or(p)) {
            None => None,
            Some(Ok(port)) => Some(port),
            Some(Err(p)) => {
                return Some(Err(format!("port {p:?} is not a number from 1 to 65535")))
            }
        };
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        Some(Ok(Self {
            addr: ip,
            prefix,
            port,
        }))
    }

    fn parse(text: &str) -> Result<Self, String> {
        let (addr_text, prefix_text) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr_text
            .parse()
            .map_err(|_| format!("{addr_text:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix_text {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("prefix length {p:?} is not between 0 and {max}"))?,
        };
        let net = Self {
            addr,
            prefix,
            port: None,
        };
        if net.network() != addr {
            // `10.0.0.1/8` is usually a typo for an address or for `10.0.0.0/8`: ask.
            return Err(format!(
                "host bits are set; did you mean {}/{prefix}?",
                net.network()
            ));
        }
        Ok(net)
    }

    fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask32(self.prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask128(self.prefix))),
        }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                u32::from(ip) & mask32(self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }

    /// Whether an allow entry lets `ip` be reached on `port` (`None`: not known, as when a name
    /// is resolved — then an entry for one port allows nothing).
    fn allows(&self, ip: IpAddr, port: Option<u16>) -> bool {
        self.contains(ip) && self.port.is_none_or(|want| port == Some(want))
    }

    /// Whether a deny entry refuses `ip` on `port` (`None`: not known — then an entry for one
    /// port refuses the address on every port).
    fn denies(&self, ip: IpAddr, port: Option<u16>) -> bool {
        self.contains(ip) && self.port.is_none_or(|want| port.is_none_or(|p| p == want))
    }

    /// Whether every address of `self` is inside `other`.
    fn within(&self, other: &Self) -> bool {
        self.prefix >= other.prefix && other.contains(self.addr)
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

/// `::ffff:169.254.169.254` is 169.254.169.254: check it as such.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Label {
    Any,
    Exact(String),
}

/// A host name or wildcard pattern, with an optional port.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NamePattern {
    labels: Vec<Label>,
    port: Option<u16>,
}

impl NamePattern {
    fn parse(text: &str) -> Result<Self, String> {
        let (name, port) = match text.rsplit_once(':') {
            Some((name, port)) => {
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("port {port:?} is not a number from 1 to 65535"))?;
                (name, Some(port))
            }
            None => (text, None),
        };
        if name.parse::<Ipv4Addr>().is_ok() || name.starts_with('[') {
            return Err(
                "an address or network applies to every port: write it without one".to_owned(),
            );
        }
        let name = name.to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        let labels = name
            .split('.')
            .map(|label| match label {
                "*" => Ok(Label::Any),
                "" => Err("empty label (two dots, or a leading dot)".to_owned()),
                l if l.contains('*') => {
                    Err("a wildcard stands for whole labels: `*.example.com`".to_owned())
                }
                l if l
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
                {
                    Ok(Label::Exact(l.to_owned()))
                }
                l => Err(format!("{l:?} is not a host name label")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { labels, port })
    }

    /// `name` is lower-case, without a trailing dot. `port: None` ignores the rule's port.
    fn matches(&self, name: &str, port: Option<u16>) -> bool {
        if let (Some(want), Some(port)) = (self.port, port) {
            if want != port {
                return false;
            }
        }
        let name: Vec<&str> = name.split('.').collect();
        let label_matches = |pattern: &Label, label: &str| match pattern {
            Label::Any => true,
            Label::Exact(exact) => exact == label,
        };
        match self.labels.split_first() {
            // A leading `*` stands for one or more labels.
            Some((Label::Any, rest)) => {
                name.len() > rest.len()
                    && rest
                        .iter()
                        .rev()
                        .zip(name.iter().rev())
                        .all(|(p, l)| label_matches(p, l))
            }
            _ => {
                name.len() == self.labels.len()
                    && self
                        .labels
                        .iter()
                        .zip(&name)
                        .all(|(p, l)| label_matches(p, l))
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    Name(NamePattern),
    Net(Net),
}

impl Rule {
    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("empty entry".to_owned());
        }
        if let Some(net) = Net::parse_with_port(text) {
            return net.map(Rule::Net);
        }
        if text.contains('/') || text.parse::<IpAddr>().is_ok() {
            return Net::parse(text).map(Rule::Net);
        }
        NamePattern::parse(text).map(Rule::Name)
    }
}

/// Why a host may not be contacted. The texts name the config key, never the rule: a Pod author
/// learns that the host is refused, not how the operator's lists read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    Denylist,
    LinkLocal,
    NotAllowlisted,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Denylist => "denied by registry_denylist",
            Self::LinkLocal => "link-local (a cloud metadata address)",
            Self::NotAllowlisted => "not in registry_allowlist",
        })
    }
}

/// The operator's allow and deny lists, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessRules {
    allow: Vec<Rule>,
    deny: Vec<Rule>,
    link_local: Vec<Net>,
}

impl Default for AccessRules {
    /// The configuration's default: everything but the link-local addresses.
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            deny: link_local().into_iter().map(Rule::Net).collect(),
            link_local: link_local(),
        }
    }
}

fn link_local() -> Vec<Net> {
    LINK_LOCAL
        .iter()
        .map(|n| Net::parse(n).expect("built-in network"))
        .collect()
}

/// A bad entry: which list, which entry, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    pub(crate) key: &'static str,
    pub(crate) reason: String,
}

impl AccessRules {
    /// Validates the lists as configured (`registry_allowlist`, `registry_denylist`).
    pub fn new(allow: &[String], deny: &[String]) -> Result<Self, RuleError> {
        let parse = |key: &'static str, list: &[String]| {
            list.iter()
                .map(|entry| {
                    Rule::parse(entry).map_err(|why| RuleError {
                        key,
                        reason: format!("{entry:?}: {why}"),
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            allow: parse("registry_allowlist", allow)?,
            deny: parse("registry_denylist", deny)?,
            link_local: link_local(),
        })
    }

    fn allow_nets(&self) -> impl Iterator<Item = &Net> {
        self.allow.iter().filter_map(|r| match r {
            Rule::Net(n) => Some(n),
            Rule::Name(_) => None,
        })
    }

    fn allow_names(&self) -> impl Iterator<Item = &NamePattern> {
        self.allow.iter().filter_map(|r| match r {
            Rule::Name(n) => Some(n),
            Rule::Net(_) => None,
        })
    }

    /// Whether the allowlist has networks that apply to every port: then a name it does not
    /// name is judged by its addresses.
    fn allows_by_address(&self) -> bool {
        self.allow_nets().any(|n| n.port.is_none())
    }

    /// Deny rules and the link-local pair, for one address on `port` (`None`: not known).
    fn address_denied(&self, ip: IpAddr, port: Option<u16>) -> Option<Denied> {
        let denied = self
            .deny
            .iter()
            .any(|r| matches!(r, Rule::Net(n) if n.denies(ip, port)));
        if denied {
            return Some(Denied::Denylist);
        }
        // Lifted only by an allowlist entry inside the link-local range itself: an operator who
        // allows 0.0.0.0/0 has not thought of the metadata service.
        let link_local = self.link_local.iter().find(|n| n.contains(ip));
        if let Some(range) = link_local {
            let lifted = self
                .allow_nets()
                .any(|allowed| allowed.allows(ip, port) && allowed.within(range));
            if !lifted {
                return Some(Denied::LinkLocal);
            }
        }
        None
    }

    /// Whether a host may be contacted, judged on the host as written in `url` (its port, or the
    /// scheme's). A name that passes is judged again by its addresses when it is resolved.
    pub(crate) fn check_url(&self, url: &reqwest::Url) -> Result<(), Denied> {
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default();
        let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        if let Ok(ip) = literal.unwrap_or(host).parse::<IpAddr>() {
            if let Some(denied) = self.address_denied(ip, port) {
                return Err(denied);
            }
            if self.allow.is_empty() || self.allow_nets().any(|n| n.allows(ip, port)) {
                return Ok(());
            }
            return Err(Denied::NotAllowlisted);
        }
        let name = host.to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        if self
            .deny
            .iter()
            .any(|r| matches!(r, Rule::Name(p) if p.matches(name, port)))
        {
            return Err(Denied::Denylist);
        }
        if self.allow.is_empty() || self.allow_names().any(|p| p.matches(name, port)) {
            return Ok(());
        }
        // Named by an allow rule for another port: that rule says which port.
        if self.allow_names().any(|p| p.matches(name, None)) {
            return Err(Denied::NotAllowlisted);
        }
        // The addresses decide, when the allowlist has networks for every port.
        if self.allows_by_address() {
            return Ok(());
        }
        Err(Denied::NotAllowlisted)
    }

    /// Whether `name` (already passed by [`AccessRules::check_url`]) may be reached at `ip`.
    pub(crate) fn address_allowed(&self, name: &str, ip: IpAddr) -> Result<(), Denied> {
        if let Some(denied) = self.address_denied(ip, None) {
            return Err(denied);
        }
        if !self.allows_by_address() {
            return Ok(());
        }
        let name = name.to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        if self.allow_names().any(|p| p.matches(name, None))
            || self.allow_nets().any(|n| n.allows(ip, None))
        {
            Ok(())
        } else {
            Err(Denied::NotAllowlisted)
        }
    }
}

/// The system resolver (getaddrinfo, as reqwest's default), keeping only the addresses the rules
/// allow: a name pointing at a denied address fails like a name that does not resolve.
pub(crate) struct FilteringResolver {
    rules: Arc<AccessRules>,
}

impl FilteringResolver {
    pub(crate) fn new(rules: Arc<AccessRules>) -> Self {
        Self { rules }
    }
}

impl reqwest::dns::Resolve for FilteringResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let rules = self.rules.clone();
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let (kept, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = resolved
                .into_iter()
                .partition(|addr| rules.address_allowed(&name, addr.ip()).is_ok());
            if !refused.is_empty() {
                let refused: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
                tracing::info!(
                    host = ?name, refused = ?refused, kept = kept.len(),
                    "registry host resolves to addresses registry_allowlist/registry_denylist refuse"
                );
            }
            if kept.is_empty() {
                return Err(format!(
                    "{name:?} resolves only to addresses registry_allowlist/registry_denylist refuse"
                )
                .into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(kept.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> AccessRules {
        let owned = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        AccessRules::new(&owned(allow), &owned(deny)).unwrap()
    }

    fn check(rules: &AccessRules, url: &str) -> Result<(), Denied> {
        rules.check_url(&reqwest::Url::parse(url).unwrap())
    }

    #[test]
    fn defaults_deny_only_link_local() {
        let r = AccessRules::default();
        for url in [
            "https://ghcr.io/v2/",
            "https://127.0.0.1:5000/v2/",
            "https://10.1.2.3/",
            "http://[::1]:5000/",
        ] {
            assert_eq!(check(&r, url), Ok(()), "{url}");
        }
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "https://169.254.1.1:443/",
            "http://[fd00:ec2::254]/",
            "http://[::ffff:169.254.169.254]/",
            // The URL parser's other IPv4 spellings are the same address.
            "http://2852039166/",
            "http://0xa9.0xfe.0xa9.0xfe/",
        ] {
            assert!(check(&r, url).is_err(), "{url}");
            // Even when the configured denylist no longer says so.
            assert_eq!(
                check(&rules(&[], &[]), url),
                Err(Denied::LinkLocal),
                "{url}"
            );
        }
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(r
            .address_allowed("metadata.internal", ip("169.254.169.254"))
            .is_err());
        assert_eq!(
            rules(&[], &[]).address_allowed("metadata.internal", ip("::ffff:169.254.169.254")),
            Err(Denied::LinkLocal)
        );
        assert_eq!(r.address_allowed("ghcr.io", ip("140.82.1.1")), Ok(()));
    }

    #[test]
    fn configured_denylist_keeps_link_local() {
        // Setting the key replaces its default, but the link-local pair stays denied.
        let r = rules(&[], &["10.0.0.0/8"]);
        assert_eq!(check(&r, "http://169.254.169.254/"), Err(Denied::LinkLocal));
        assert_eq!(check(&r, "https://10.9.9.9/"), Err(Denied::Denylist));
        // An allowlist of everything does not lift it; naming the range does.
        let r = rules(&["0.0.0.0/0"], &[]);
        assert_eq!(check(&r, "http://169.254.169.254/"), Err(Denied::LinkLocal));
        let r = rules(&["169.254.20.0/24"], &[]);
        assert_eq!(check(&r, "http://169.254.20.10:5000/"), Ok(()));
        assert_eq!(check(&r, "http://169.254.169.254/"), Err(Denied::LinkLocal));
        // ... unless the denylist names it: a deny entry always wins.
        let r = rules(&["169.254.20.0/24"], &LINK_LOCAL);
        assert_eq!(
            check(&r, "http://169.254.20.10:5000/"),
            Err(Denied::Denylist)
        );
    }

    #[test]
    fn names_wildcards_and_ports() {
        let r = rules(
            &[
                "*.dkr.ecr.*.amazonaws.com",
                "*.Example.com",
                "registry.internal:5000",
                "ghcr.io",
            ],
            &["bad.example.com", "*.corp.example.com:443"],
        );
        for (url, want) in [
            (
                "https://123456789012.dkr.ecr.eu-west-1.amazonaws.com/v2/",
                Ok(()),
            ),
            (
                "https://123456789012.dkr.ecr.eu.west-1.amazonaws.com/v2/",
                Err(Denied::NotAllowlisted),
            ),
            (
                "https://dkr.ecr.eu-west-1.amazonaws.com/",
                Err(Denied::NotAllowlisted),
            ),
            ("https://a.example.com/", Ok(())),
            ("https://A.B.EXAMPLE.COM./", Ok(())),
            ("https://example.com/", Err(Denied::NotAllowlisted)),
            ("https://bad.example.com:8443/", Err(Denied::Denylist)),
            ("https://x.corp.example.com/", Err(Denied::Denylist)),
            ("https://x.corp.example.com:8443/", Ok(())),
            ("http://registry.internal:5000/", Ok(())),
            ("http://REGISTRY.internal:5000/", Ok(())),
            (
                "http://registry.internal:5001/",
                Err(Denied::NotAllowlisted),
            ),
            ("https://ghcr.io/", Ok(())),
            ("https://ghcr.io:8443/", Ok(())),
            ("https://notghcr.io/", Err(Denied::NotAllowlisted)),
            // An allowlist of names: addresses must be named too.
            ("https://127.0.0.1/", Err(Denied::NotAllowlisted)),
        ] {
            assert_eq!(check(&r, url), want, "{url}");
        }
    }

    #[test]
    fn networks_judge_resolved_addresses() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let r = rules(&["10.0.0.0/8", "ghcr.io"], &["10.6.6.0/24", "::1"]);
        // A name the allowlist does not name: its addresses decide.
        assert_eq!(check(&r, "https://registry.corp/"), Ok(()));
        assert_eq!(r.address_allowed("registry.corp", ip("10.1.1.1")), Ok(()));
        assert_eq!(
            r.address_allowed("registry.corp", ip("192.168.1.1")),
            Err(Denied::NotAllowlisted)
        );
        assert_eq!(
            r.address_allowed("registry.corp", ip("10.6.6.6")),
            Err(Denied::Denylist)
        );
        // A name the allowlist names: only deny rules apply to its addresses.
        assert_eq!(r.address_allowed("ghcr.io", ip("140.82.1.1")), Ok(()));
        assert_eq!(
            r.address_allowed("GHCR.io", ip("10.6.6.1")),
            Err(Denied::Denylist)
        );
        assert_eq!(
            r.address_allowed("localhost", ip("::1")),
            Err(Denied::Denylist)
        );
        assert_eq!(check(&r, "http://[::1]:5000/"), Err(Denied::Denylist));
        assert_eq!(check(&r, "http://10.2.3.4:5000/"), Ok(()));
        assert_eq!(
            check(&r, "http://11.2.3.4:5000/"),
            Err(Denied::NotAllowlisted)
        );
        // Without allowlist networks, names were judged as written.
        let r = rules(&["ghcr.io"], &[]);
        assert_eq!(r.address_allowed("proxy.corp", ip("192.168.1.1")), Ok(()));
    }

    #[test]
    fn bad_entries_say_why() {
        for (entry, why) in [
            ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
            ("10.0.0.0/33", "prefix length"),
            ("fd00::/129", "prefix length"),
            ("10.0.0/8", "not an IP address"),
            ("reg*.example.com", "whole labels"),
            ("a..b", "empty label"),
            ("host:0", "port"),
            ("host:http", "port"),
            ("10.0.0.1:0", "port"),
            ("10.0.0.1:http", "port"),
            ("[::1]:70000", "port"),
            ("10.0.0.0/8:5000", "every port"),
            ("[fd00::/8]:5000", "every port"),
            ("[::1", "lacks its `]`"),
            ("[::1]5000", "is not `:port`"),
            ("[10.0.0.1]:5000", "not an IP address"),
            ("[nope]:5000", "not an IP address"),
            ("bad host", "not a host name label"),
            ("", "empty"),
        ] {
            let err = AccessRules::new(&[], &[entry.to_owned()]).unwrap_err();
            assert_eq!(err.key, "registry_denylist");
            assert!(
                err.reason.contains(why) && err.reason.contains(&format!("{entry:?}")),
                "{entry}: {err:?}"
            );
        }
        let err = AccessRules::new(&["*.ok.com".into(), "x/y".into()], &[]).unwrap_err();
        assert_eq!(err.key, "registry_allowlist");
        for good in [
            "0.0.0.0/0",
            "::/0",
            "fd00:ec2::254/128",
            "*",
            "*.x.y:5000",
            "h_1.x",
            "10.0.0.1:5000",
            "[::1]:5000",
            "[fd00::5]",
        ] {
            AccessRules::new(&[good.to_owned()], &[]).unwrap_or_else(|e| panic!("{good}: {e:?}"));
        }
    }

    #[test]
    fn addresses_with_a_port_allow_and_deny_that_port_only() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let r = rules(&["10.0.0.5:5000", "[fd00::5]:5000"], &[]);
        for (url, want) in [
            ("http://10.0.0.5:5000/v2/", Ok(())),
            ("http://10.0.0.5:5001/v2/", Err(Denied::NotAllowlisted)),
            ("https://10.0.0.5/v2/", Err(Denied::NotAllowlisted)),
            ("http://10.0.0.6:5000/v2/", Err(Denied::NotAllowlisted)),
            ("http://[fd00::5]:5000/v2/", Ok(())),
            ("http://[fd00::5]:443/v2/", Err(Denied::NotAllowlisted)),
            // The same address, spelled another way.
            ("http://[::ffff:10.0.0.5]:5000/v2/", Ok(())),
            ("http://167772165:5000/v2/", Ok(())),
            // A name is allowed by its name: an address with a port does not let a name through.
            (
                "http://registry.internal:5000/v2/",
                Err(Denied::NotAllowlisted),
            ),
        ] {
            assert_eq!(check(&r, url), want, "{url}");
        }
        assert_eq!(
            r.address_allowed("registry.internal", ip("10.0.0.5")),
            Ok(()),
            "only deny rules judge a name's addresses when no network allows by address"
        );

        // A deny entry with a port: that port, as written; every port for a resolved name.
        let r = rules(&[], &["10.0.0.5:5000", "[fd00::5]:22"]);
        assert_eq!(check(&r, "http://10.0.0.5:5000/"), Err(Denied::Denylist));
        assert_eq!(check(&r, "http://10.0.0.5:5001/"), Ok(()));
        assert_eq!(check(&r, "http://[fd00::5]:22/"), Err(Denied::Denylist));
        assert_eq!(check(&r, "https://[fd00::5]/"), Ok(()));
        assert_eq!(
            r.address_allowed("sneaky.example", ip("10.0.0.5")),
            Err(Denied::Denylist)
        );

        // With a network for every port beside it, names are judged by address, the port-bound
        // entry not counting (its port is not known there).
        let r = rules(&["10.0.0.5:5000", "192.168.0.0/16"], &[]);
        assert_eq!(check(&r, "https://registry.corp/"), Ok(()));
        assert_eq!(
            r.address_allowed("registry.corp", ip("10.0.0.5")),
            Err(Denied::NotAllowlisted)
        );
        assert_eq!(
            r.address_allowed("registry.corp", ip("192.168.1.1")),
            Ok(())
        );

        // A port on a link-local address lifts it for that port only.
        let r = rules(&["169.254.20.10:5000"], &[]);
        assert_eq!(check(&r, "http://169.254.20.10:5000/"), Ok(()));
        assert_eq!(
            check(&r, "http://169.254.20.10:80/"),
            Err(Denied::LinkLocal)
        );
    }
}
