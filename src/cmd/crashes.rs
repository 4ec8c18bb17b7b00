//! `tolerable crashes list | forget`: what `serve`'s crash watch learned (digests that crashed
//! with exec format error on an architecture their index claims), read from and forgotten in
//! the shared cache the config names (`crate::crashes::shared`). Without a shared cache it
//! lives in each replica's memory, out of reach: the command says so.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{
    CrashesArgs, CrashesCommand, CRASHES_DONE, CRASHES_NOTHING_LEARNED, CRASHES_NOT_SHARED,
};
use crate::config::Config;
use crate::crashes::shared::SharedLearned;

pub(crate) async fn run(
    config: &Config,
    args: &CrashesArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let Some(settings) = config.resolver.shared_cache.clone() else {
        writeln!(
            out,
            "no shared cache is configured (shared_cache.url): what the crash watch learned lives in each serve replica's memory, for 24h; restart the replicas to forget it"
        )?;
        return Ok(CRASHES_NOT_SHARED.into());
    };
    let store = SharedLearned::new(settings).map_err(anyhow::Error::msg)?;
    match &args.command {
        CrashesCommand::List => list(&store, out).await,
        CrashesCommand::Forget { digest, arch } => {
            forget(&store, digest, arch.as_deref(), out).await
        }
    }
}

async fn list(store: &SharedLearned, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let entries = store.entries().await.map_err(anyhow::Error::msg)?;
    if entries.is_empty() {
        writeln!(out, "nothing learned (in {})", store.url())?;
        return Ok(CRASHES_DONE.into());
    }
    let rows: Vec<[String; 4]> = entries
        .iter()
        .flat_map(|entry| {
            entry.architectures.iter().map(|(arch, namespace)| {
                [
                    entry.digest.clone(),
                    arch.clone(),
                    namespace.clone(),
                    format!("in {}", hours_and_minutes(entry.expires_in)),
                ]
            })
        })
        .collect();
    super::write_table(
        out,
        ["DIGEST", "DOES NOT RUN ON", "LEARNED IN", "FORGOTTEN"],
        &rows,
    )?;
    Ok(CRASHES_DONE.into())
}

async fn forget(
    store: &SharedLearned,
    digest: &str,
    arch: Option<&str>,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let shaped = digest
        .split_once(':')
        .is_some_and(|(algorithm, hex)| !algorithm.is_empty() && !hex.is_empty())
        && !digest.chars().any(char::is_whitespace);
    if !shaped {
        anyhow::bail!("{digest:?} is not a digest (sha256:…, as `tolerable crashes list` shows)");
    }
    let forgotten = store
        .forget(digest, arch)
        .await
        .map_err(anyhow::Error::msg)?;
    let what = arch.map_or(String::new(), |a| format!(" on {a}"));
    if forgotten == 0 {
        writeln!(out, "nothing learned of {digest}{what}: nothing forgotten")?;
        return Ok(CRASHES_NOTHING_LEARNED.into());
    }
    writeln!(
        out,
        "{digest}: forgot {forgotten} architecture(s){what} in the shared cache; every replica places it as its index says again within {}s (an entry a replica could not write to the shared cache stays in its memory until it restarts)",
        crate::crashes::REFRESH_EVERY.as_secs()
    )?;
    Ok(CRASHES_DONE.into())
}

/// `23h59m`, `5m`.
fn hours_and_minutes(left: Duration) -> String {
    let minutes = left.as_secs().div_ceil(60);
    match (minutes / 60, minutes % 60) {
        (0, m) => format!("{m}m"),
        (h, m) => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_is_shown_in_hours_and_minutes() {
        assert_eq!(hours_and_minutes(Duration::from_secs(24 * 3600)), "24h00m");
        assert_eq!(hours_and_minutes(Duration::from_secs(3599)), "1h00m");
        assert_eq!(hours_and_minutes(Duration::from_secs(61)), "2m");
        assert_eq!(
            hours_and_minutes(Duration::from_secs(3 * 3600 + 300)),
            "3h05m"
        );
    }
}
