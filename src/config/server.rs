//! `[server]`, `[tls]` and `[log]`: where and how `serve` listens, the limits it holds clients
//! to, its certificate, and its log. The limits' type ([`ServerLimits`]) and the reload's name
//! check ([`NameCheck`]) are settings, defined here with their defaults and checks; the server
//! takes them as values.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::reference::{KeyDoc, SectionDoc};
use super::values::Word;
use super::{parse_duration, ConfigError};
use crate::duration::format_config;

/// More threads than this is a typo, not a tuning.
const MAX_WORKER_THREADS: usize = 256;
/// More connections or requests than this is a typo: the fd limit is far lower.
const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;
/// The API server's default webhook timeout: reading a request must end well before it.
const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest idle timeout accepted.
const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Connection and request limits (the `[server]` keys of the same names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Open client connections. At the cap a new one takes the slot of the oldest connection
    /// that has not had a request answered yet; failing that it is let in for probes or closed
    /// at once. Lowered at start to fit the fd limit.
    pub max_connections: usize,
    /// Open connections from one client address (the same rules at its own cap: its own
    /// connections give way), so one client cannot take every slot.
    pub max_connections_per_peer: usize,
    /// `/mutate` requests being answered at once (their bodies read: reading a body is bounded
    /// by the body budgets and `request_read_timeout` instead); more get a fast 503.
    pub max_requests_in_flight: usize,
    /// TLS handshake, then a request's head and body, each within this.
    pub request_read_timeout: Duration,
    /// A connection with no request in progress for this long is closed.
    pub connection_idle_timeout: Duration,
}

impl Default for ServerLimits {
    /// The defaults of the `[server]` limits (the one copy: the section's defaults are read
    /// from it).
    fn default() -> Self {
        Self {
            max_connections: 1000,
            max_connections_per_peer: 500,
            max_requests_in_flight: 256,
            request_read_timeout: Duration::from_secs(5),
            // Longer than the API server's own idle timeout (Go's 90 s): the client closes an
            // idle connection first, so it never sends a request into one being closed.
            connection_idle_timeout: Duration::from_secs(120),
        }
    }
}

/// What a reload does with a certificate that does not cover every DNS name and IP address the
/// certificate served at start covered (`[tls] reload_name_check`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameCheck {
    /// Keep serving the current certificate; the reload counts as failed.
    #[default]
    Refuse,
    /// Serve it, with a warning naming the names it dropped.
    Warn,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[server]` as written.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct ServerSection {
    listen_addr: String,
    metrics_addr: Option<String>,
    worker_threads: usize,
    max_connections: usize,
    /// Unset: half of `max_connections`.
    max_connections_per_peer: Option<usize>,
    max_requests_in_flight: usize,
    request_read_timeout: String,
    connection_idle_timeout: String,
}

impl Default for ServerSection {
    fn default() -> Self {
        let limits = ServerLimits::default();
        Self {
            listen_addr: "0.0.0.0:8443".into(),
            metrics_addr: None,
            worker_threads: 0,
            max_connections: limits.max_connections,
            max_connections_per_peer: None,
            max_requests_in_flight: limits.max_requests_in_flight,
            request_read_timeout: format_config(limits.request_read_timeout),
            connection_idle_timeout: format_config(limits.connection_idle_timeout),
        }
    }
}

/// `[server]`, checked.
pub(super) struct Server {
    pub(super) listen_addr: SocketAddr,
    pub(super) metrics_addr: Option<SocketAddr>,
    pub(super) worker_threads: Option<usize>,
    pub(super) limits: ServerLimits,
}

impl ServerSection {
    pub(super) fn validate(&self) -> Result<Server, ConfigError> {
        let (listen_addr, metrics_addr) = self.addresses()?;
        Ok(Server {
            listen_addr,
            metrics_addr,
            worker_threads: self.worker_threads()?,
            limits: self.limits()?,
        })
    }

    fn worker_threads(&self) -> Result<Option<usize>, ConfigError> {
        let n = self.worker_threads;
        if n > MAX_WORKER_THREADS {
            return Err(ConfigError::key(
                "server.worker_threads",
                format!("{n} is more than {MAX_WORKER_THREADS} (0: one per CPU)"),
            ));
        }
        Ok((n > 0).then_some(n))
    }

    /// The abuse limits of `serve`: every bound is checked, so a typo cannot switch one off.
    fn limits(&self) -> Result<ServerLimits, ConfigError> {
        let max_connections_per_peer = self
            .max_connections_per_peer
            .unwrap_or((self.max_connections / 2).max(1));
        for (key, n) in [
            ("server.max_connections", self.max_connections),
            ("server.max_connections_per_peer", max_connections_per_peer),
            ("server.max_requests_in_flight", self.max_requests_in_flight),
        ] {
            if !(1..=MAX_CONNECTIONS_LIMIT).contains(&n) {
                return Err(ConfigError::key(
                    key,
                    format!("{n} is not between 1 and {MAX_CONNECTIONS_LIMIT}"),
                ));
            }
        }
        let read_key = "server.request_read_timeout";
        let request_read_timeout = parse_duration(read_key, &self.request_read_timeout)?;
        if request_read_timeout.is_zero() || request_read_timeout >= DEFAULT_WEBHOOK_TIMEOUT {
            return Err(ConfigError::key(
                read_key,
                "must be above 0 and below 10s (the API server's default webhook timeout)",
            ));
        }
        let idle_key = "server.connection_idle_timeout";
        let connection_idle_timeout = parse_duration(idle_key, &self.connection_idle_timeout)?;
        if connection_idle_timeout.is_zero() || connection_idle_timeout > MAX_IDLE_TIMEOUT {
            return Err(ConfigError::key(idle_key, "must be above 0 and at most 1h"));
        }
        if max_connections_per_peer > self.max_connections {
            return Err(ConfigError::key(
                "server.max_connections_per_peer",
                format!(
                    "{max_connections_per_peer} is above max_connections ({})",
                    self.max_connections
                ),
            ));
        }
        Ok(ServerLimits {
            max_connections: self.max_connections,
            max_connections_per_peer,
            max_requests_in_flight: self.max_requests_in_flight,
            request_read_timeout,
            connection_idle_timeout,
        })
    }

    fn addresses(&self) -> Result<(SocketAddr, Option<SocketAddr>), ConfigError> {
        let address = |key: &str, text: &str, example: &str| {
            text.trim().parse::<SocketAddr>().map_err(|_| {
                ConfigError::key(
                    key,
                    format!("{text:?} is not an address:port (e.g. {example})"),
                )
            })
        };
        let listen_addr = address("server.listen_addr", &self.listen_addr, "0.0.0.0:8443")?;
        let metrics_addr = match self.metrics_addr.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(text) => Some(address("server.metrics_addr", text, "0.0.0.0:9090")?),
        };
        if metrics_addr.is_some_and(|m| m.port() == listen_addr.port() && m.port() != 0) {
            return Err(ConfigError::key(
                "server.metrics_addr",
                "must use another port than listen_addr",
            ));
        }
        Ok((listen_addr, metrics_addr))
    }
}

/// `[tls]` as written.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct TlsSection {
    cert_path: Option<PathBuf>,
    key_path: Option<PathBuf>,
    reload_name_check: Word<NameCheck>,
}

impl Default for TlsSection {
    fn default() -> Self {
        Self {
            cert_path: None,
            key_path: None,
            reload_name_check: Word::Known(NameCheck::default()),
        }
    }
}

impl TlsSection {
    /// The certificate and key files (both, or neither) and the reload's name check.
    pub(super) fn validate(&self) -> Result<(Option<(PathBuf, PathBuf)>, NameCheck), ConfigError> {
        let name_check = self
            .reload_name_check
            .clone()
            .get("tls.reload_name_check")?;
        let files = match (&self.cert_path, &self.key_path) {
            (Some(cert), Some(key)) => {
                for (k, path) in [("tls.cert_path", cert), ("tls.key_path", key)] {
                    if !path.exists() {
                        return Err(ConfigError::key(
                            k,
                            format!("{} does not exist", path.display()),
                        ));
                    }
                }
                Some((cert.clone(), key.clone()))
            }
            (Some(_), None) => {
                return Err(ConfigError::key(
                    "tls.key_path",
                    "must be set with tls.cert_path",
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::key(
                    "tls.cert_path",
                    "must be set with tls.key_path",
                ))
            }
            (None, None) => None,
        };
        Ok((files, name_check))
    }
}

/// `[log]` as written.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct LogSection {
    level: String,
    format: Word<LogFormat>,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: Word::Known(LogFormat::default()),
        }
    }
}

impl LogSection {
    /// The filter (checked as `tracing` reads it) and the format.
    pub(super) fn validate(&self) -> Result<(String, LogFormat), ConfigError> {
        tracing_subscriber::EnvFilter::try_new(&self.level)
            .map_err(|e| ConfigError::key("log.level", format!("{:?}: {e}", self.level)))?;
        Ok((self.level.clone(), self.format.clone().get("log.format")?))
    }
}

super::values::words_by_serde!(NameCheck, LogFormat);

pub(super) const SERVER_DOC: SectionDoc = SectionDoc {
    name: "server",
    banner: Some("Webhook"),
    about: &[],
    intro: "",
    keys: &[
        KeyDoc {
            key: "listen_addr",
            meaning: "HTTPS address (`POST /mutate`, `GET /healthz`, `/readyz`, `/metrics`)",
            about: &[
                "Address and port to serve HTTPS on (POST /mutate, GET /healthz, /readyz, /metrics).",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "metrics_addr",
            meaning: "serve `/metrics` (and `/healthz`) there, plain HTTP, instead of on the webhook port",
            about: &[
                "Serve /metrics (and /healthz) on this address over plain HTTP instead of on the webhook port,",
                "so a NetworkPolicy can open it to the monitoring namespace alone. Unset: /metrics is on the",
                "webhook port. The shipped Deployment sets 0.0.0.0:9090 (port name `metrics`).",
            ],
            example: Some("\"0.0.0.0:9090\""),
            inline: None,
            default_note: None,
            deployed: true,
        },
        KeyDoc {
            key: "worker_threads",
            meaning: "request threads; `0`: one per CPU available (the container's CPU limit); at most 256",
            about: &[
                "Threads answering requests. 0: one per CPU available to the process — in a container, its CPU",
                "limit (the shipped Deployment's limit of 1 CPU gives one thread). The webhook waits on",
                "registries, not on the CPU: one thread answers tens of thousands of cached admissions a",
                "second, and uses less CPU per admission than two (BENCHMARKS.md).",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "max_connections",
            meaning: "open client connections; at the cap a new one takes a pending connection's slot, else 8 more are let in for probes (a request of another kind on one takes an idle connection's slot), the rest are closed at once; lowered to fit the open-files limit",
            about: &[
                "Connections and requests: limits against slow or abusive clients.",
                "Open client connections. At the cap, a new connection takes the slot of the oldest one that",
                "has not had a request answered yet (a TLS handshake or a first request still to come), so a",
                "flood of connections that say nothing only replaces itself; failing that, a few (8) are let in",
                "for /healthz and /readyz, and a request of another kind on one of those takes the slot of the",
                "longest idle keep-alive connection (those that never had an admission answered first); the",
                "rest are closed at once. A connection with a request in progress keeps its slot. At start the",
                "soft limit on open files is raised to the hard limit, and this is lowered if it still does not",
                "fit.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "max_connections_per_peer",
            meaning: "open connections from one client address, the same rules at its own cap (its own connections give way); at most `max_connections`",
            about: &[
                "Open connections from one client address, with the same rules at its own cap (its own",
                "connections give way), so one address cannot take every slot. Default: half of",
                "max_connections; at most max_connections.",
            ],
            example: Some("500"),
            inline: None,
            default_note: Some("half of `max_connections`"),
            deployed: false,
        },
        KeyDoc {
            key: "max_requests_in_flight",
            meaning: "`/mutate` requests answered at once (bodies read; reading one takes no permit); more get a fast 503",
            about: &[
                "POST /mutate requests being answered at once, once their bodies are read (reading a body is",
                "bounded by request_read_timeout and the body budgets instead, so stalled bodies cannot lock",
                "out the API server's requests). More get an immediate 503 with a JSON reason (the API server",
                "then applies the webhook's failurePolicy: Ignore in kustomize/base).",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "request_read_timeout",
            meaning: "TLS handshake, then a request's head and body, each within this (below 10s); else 408",
            about: &[
                "The TLS handshake, then each request's head and body (from its first byte to its last), must",
                "arrive within this; else 408 and the connection is closed. Below 10s, the API server's default",
                "webhook timeout. Request bodies are also held to memory budgets: 9 MiB per connection, 48 MiB",
                "for the process (503 beyond); a gzip body's inflated bytes count too.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "connection_idle_timeout",
            meaning: "a connection with no request in progress is closed after this (at most 1h)",
            about: &[
                "A connection (HTTP/1.1 or h2) with no request in progress for this long is closed. Longer than",
                "the API server's own 90s, so the client closes an idle connection first.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const TLS_DOC: SectionDoc = SectionDoc {
    name: "tls",
    banner: None,
    about: &[],
    intro: "",
    keys: &[
        KeyDoc {
            key: "cert_path",
            meaning: "serving certificate (PEM), re-read every second; with `key_path`. Unset: `serve` makes a self-signed one",
            about: &[
                "Serving certificate and key (PEM), e.g. the cert-manager Secret mounted as a volume. They are",
                "re-read every second, so a rotation is served without a restart. Without them, `serve`",
                "generates a self-signed certificate for localhost and prints its CA (for trying it out).",
            ],
            example: Some("\"/etc/tolerable/tls/tls.crt\""),
            inline: None,
            default_note: None,
            deployed: true,
        },
        KeyDoc {
            key: "key_path",
            meaning: "its private key (PEM); with `cert_path`",
            about: &[],
            example: Some("\"/etc/tolerable/tls/tls.key\""),
            inline: None,
            default_note: None,
            deployed: true,
        },
        KeyDoc {
            key: "reload_name_check",
            meaning: "a reloaded certificate that drops a DNS name or IP address of the starting one: `refuse` (keep the current one) or `warn` (serve it); files over 1 MiB are never read",
            about: &[
                "A reloaded certificate must cover every DNS name and IP address the certificate served at",
                "start covered (the Service's names the API server calls, or the address of a `url` webhook):",
                "\"refuse\" keeps the current one and counts a failed reload; \"warn\" serves it with an error in",
                "the log. A certificate or key file over 1 MiB is not read (a failed reload, with a warning).",
            ],
            example: None,
            inline: Some("refuse | warn"),
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const LOG_DOC: SectionDoc = SectionDoc {
    name: "log",
    banner: None,
    about: &[],
    intro: "",
    keys: &[
        KeyDoc {
            key: "level",
            meaning: "level or tracing directives (`info,tolerable=debug`); logs go to stderr",
            about: &[
                "Log filter: a level (error, warn, info, debug, trace) or tracing directives such as",
                "\"info,tolerable=debug\". Logs go to stderr.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "format",
            meaning: "`text` (without colour escapes) or `json`",
            about: &[
                "text | json",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};
