//! Subcommands: thin wiring from the CLI to the library.

pub(crate) mod audit;
pub(crate) mod inspect;
pub(crate) mod nodes;
pub(crate) mod review;
pub(crate) mod serve;

use std::fmt::Write as _;
use std::io::Write;
use std::process::ExitCode;

use crate::cli::{Cli, Command};
use crate::config::Config;

/// Runs the command; `Err` is a start-up failure (bad config), printed by `main`.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = Config::from_process(cli.config.as_deref())?;
    crate::telemetry::init(&config);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.worker_threads {
        runtime.worker_threads(threads);
    }
    let runtime = runtime.enable_all().build()?;
    let result = match cli.command {
        Command::Inspect(args) => {
            runtime.block_on(inspect::run(&config, &args, &mut std::io::stdout()))
        }
        Command::Serve(args) => runtime.block_on(serve::run(&config, &args)),
        Command::Nodes(command) => {
            runtime.block_on(nodes::run(&config, &command, &mut std::io::stdout()))
        }
        Command::Audit(args) => {
            runtime.block_on(audit::run(&config, &args, &mut std::io::stdout()))
        }
        Command::Review(args) => {
            runtime.block_on(review::run(&config, &args, &mut std::io::stdout()))
        }
    };
    crate::telemetry::flush();
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
