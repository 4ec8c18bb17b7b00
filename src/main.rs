use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    // Pin the crypto provider before any TLS client exists: several dependencies would otherwise
    // pull in a second one and rustls would refuse to choose.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = tolerable::cli::Cli::parse();
    match tolerable::cmd::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tolerable: {e:#}");
            ExitCode::from(2)
        }
    }
}
