use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    // Pin the crypto provider before any TLS client exists: several dependencies would otherwise
    // pull in a second one and rustls would refuse to choose.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = tolerable::cli::Cli::parse();
    match tolerable::cmd::run(cli) {
        Ok(code) => code,
        // A reader that stopped reading (`tolerable review f | head`): the output ends quietly,
        // with the status a shell gives a program SIGPIPE ended (128 + 13), as git's does — not
        // success, which could pass a gate whose result was never read.
        Err(e) if closed_pipe(&e) => tolerable::cli::READER_STOPPED.into(),
        Err(e) => {
            // Not eprintln!: it panics when standard error is closed too (`2>&1 | head`).
            let _ = writeln!(std::io::stderr(), "tolerable: {e:#}");
            tolerable::cli::COULD_NOT_RUN.into()
        }
    }
}

fn closed_pipe(error: &anyhow::Error) -> bool {
    let broken = Some(std::io::ErrorKind::BrokenPipe);
    error.chain().any(|cause| {
        // serde_json wraps the write error without giving it as its source.
        cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            == broken
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == broken
    })
}
