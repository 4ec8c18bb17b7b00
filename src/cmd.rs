//! Subcommands: thin wiring from the CLI to the library.

pub(crate) mod audit;
pub(crate) mod check;
pub(crate) mod crashes;
pub(crate) mod gates;
pub(crate) mod inspect;
pub(crate) mod nodes;
pub(crate) mod reference;
pub(crate) mod review;
pub(crate) mod serve;

use std::fmt::Write as _;
use std::io::Write;
use std::process::ExitCode;

use crate::cli::{Cli, ClusterArgs, Command};
use crate::cluster::connect::ClusterChoice;
use crate::config::Config;

/// Runs the command; `Err` is a start-up failure (bad config), printed by `main`.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // Printed from the code alone: no config is read, so a local tolerable.toml or TOLERABLE_*
    // variable cannot change what is generated.
    if let Command::Reference(args) = &cli.command {
        return reference::run(args, &mut std::io::stdout());
    }
    let config = Config::from_process(cli.config.as_deref())?;
    crate::telemetry::init(&config);
    config.warn_deprecated_keys();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.worker_threads {
        runtime.worker_threads(threads);
    }
    let runtime = runtime.enable_all().build()?;
    let mut out = std::io::stdout();
    let result = match cli.command {
        Command::Inspect(args) => run_to_end(runtime, inspect::run(&config, &args, &mut out)),
        Command::Serve(args) => run_to_end(runtime, serve::run(&config, &args)),
        Command::Nodes(args) => run_to_end(runtime, nodes::run(&config, &args, &mut out)),
        Command::Audit(args) => run_to_end(runtime, audit::run(&config, &args, &mut out)),
        Command::Review(args) => run_to_end(runtime, review::run(&config, &args, &mut out)),
        Command::Gates(args) => run_to_end(runtime, gates::run(&args, &mut out)),
        Command::Check(args) => run_to_end(runtime, check::run(&args, &mut out)),
        Command::Crashes(args) => run_to_end(runtime, crashes::run(&config, &args, &mut out)),
        Command::Reference(args) => reference::run(&args, &mut out),
    };
    crate::telemetry::flush();
    result
}

impl ClusterArgs {
    /// The cluster these flags name, for [`crate::cluster::connect::client`].
    pub(crate) fn choice(&self) -> ClusterChoice<'_> {
        ClusterChoice {
            kubeconfig: self.kubeconfig.as_deref(),
            context: self.context.as_deref(),
        }
    }
}

/// Runs `command` on `runtime`, then leaves whatever is still running on it without waiting:
/// the answer is written, and a DNS query (getaddrinfo runs on a blocking thread that cannot be
/// cancelled) or a connection that outlived its lookup's deadline must not hold the exit.
fn run_to_end<T>(
    runtime: tokio::runtime::Runtime,
    command: impl std::future::Future<Output = T>,
) -> T {
    let result = runtime.block_on(command);
    runtime.shutdown_background();
    result
}

/// Rows under a header, each column as wide as its widest cell (the last one left ragged), as
/// kubectl prints tables.
pub(crate) fn write_table<const N: usize>(
    out: &mut impl Write,
    header: [&str; N],
    rows: &[[String; N]],
) -> std::io::Result<()> {
    let header = header.map(str::to_owned);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:width$}  ");
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// The ARCHITECTURES cell of `review` and `audit`: the architectures a workload's images share,
/// `none` when they share none, `?` when some image is unknown.
pub(crate) fn architectures_cell(common: Option<&[String]>) -> String {
    match common {
        Some([]) => "none".to_owned(),
        Some(common) => common.join(","),
        None => "?".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    /// A blocking task left behind (as a getaddrinfo past its lookup's deadline) does not hold
    /// the command's end: it is still blocked when the answer comes back.
    #[test]
    fn the_answer_does_not_wait_for_a_blocking_task_left_behind() {
        let (release, blocked) = mpsc::channel::<()>();
        let (answered, answer) = mpsc::channel();
        let finished = Arc::new(AtomicBool::new(false));
        let task_finished = Arc::clone(&finished);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .unwrap();
            let value = super::run_to_end(runtime, async move {
                let (started, running) = tokio::sync::oneshot::channel();
                drop(tokio::task::spawn_blocking(move || {
                    let _ = started.send(());
                    let _ = blocked.recv();
                    task_finished.store(true, Ordering::SeqCst);
                }));
                running.await.unwrap();
                42
            });
            let _ = answered.send(value);
        });
        // A bound far above any scheduling delay: without shutdown_background the runtime
        // waits for the blocked task, which waits for this test.
        let value = answer.recv_timeout(Duration::from_secs(60));
        let still_blocked = !finished.load(Ordering::SeqCst);
        let _ = release.send(());
        assert_eq!(value, Ok(42), "the command did not end");
        assert!(still_blocked);
    }
}
