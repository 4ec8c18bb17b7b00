//! Logging set-up, in one place. Logs go to stderr so command output on stdout stays clean.

use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};

pub fn init(config: &Config) {
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests, repeated commands) keeps the first subscriber.
    let _ = match config.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
