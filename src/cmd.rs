//! Subcommands: thin wiring from the CLI to the library.

pub(crate) mod audit;
pub(crate) mod inspect;
pub(crate) mod nodes;
pub(crate) mod review;
pub(crate) mod serve;

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
