//! `[server]`, `[tls]` and `[log]`: where and how `serve` listens, the limits it holds clients
//! to, its certificate, and its log. The limits' type ([`ServerLimits`]) and the reload's name
//! check ([`NameCheck`]) are settings, defined here with their defaults and checks; the server
//! takes them as values.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NameCheck {
    /// Keep serving the current certificate; the reload counts as failed.
    #[default]
    Refuse,
    /// Serve it, with a warning naming the names it dropped.
    Warn,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[server]` as written.
#[derive(Debug, Deserialize)]
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
#[derive(Debug, Deserialize)]
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
#[derive(Debug, Deserialize)]
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
