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
        // A reader that stopped reading (`tolerable review f | head`) is not an error: the
        // output ends quietly, as other command-line tools' do.
        Err(e) if closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Not eprintln!: it panics when standard error is closed too (`2>&1 | head`).
            let _ = writeln!(std::io::stderr(), "tolerable: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
