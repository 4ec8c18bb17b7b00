use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

/// The static musl binaries the images ship allocate through mimalloc: musl's own allocator
/// (mallocng) mapped and unmapped memory about once per admission (an `mmap` and a `munmap`,
/// with the TLB shootdowns a `munmap` costs) and takes a lock on every call. On the real-path
/// bench the amd64 build spent ~95 µs per deciding admission with it and ~65 µs with mimalloc
/// (the glibc build: ~60), at about the same RSS (BENCHMARKS.md, session 16). Builds against
/// glibc (the tests, the benches, s390x's image) keep glibc's allocator.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
