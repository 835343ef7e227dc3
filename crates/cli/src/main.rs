//! `softhca`: device information and perftest-style benchmarks for the softhca
//! user-space RoCEv2 device.

mod args;
mod bench;
mod devinfo;
mod error;
mod local;
mod perf;
mod progress;
mod report;
mod size;
mod stat;
mod stream;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::error::CliError;

fn main() -> ExitCode {
    // One line, never a backtrace: a panic is a bug, but the user still gets a readable
    // message and exit status 1 like every other failure.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let loc = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("softhca: internal error: {}{loc}", msg.replace('\n', " "));
    }));
    // Logs only when asked for: errors must stay one line on stderr.
    if let Some(filter) = softhca::Diagnostics::from_env().log {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        // `softhca devinfo | head`: the reader left; not an error worth a message.
        Ok(Err(CliError::Output(e))) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("softhca: {e}");
            ExitCode::from(1)
        }
        Err(_) => ExitCode::from(1),
    }
}

/// clap errors as one `softhca: ` line with status 1 (help and version print as usual).
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    {
        let _ = e.print();
        return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        };
    }
    // A value parser's own message ("invalid size '12Q'") says it best.
    let msg = match (e.kind(), std::error::Error::source(&e)) {
        (ErrorKind::ValueValidation, Some(src)) => src.to_string(),
        _ => {
            let rendered = e.render().to_string();
            let first = rendered
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim();
            format!(
                "{} (see softhca --help)",
                first.strip_prefix("error: ").unwrap_or(first)
            )
        }
    };
    eprintln!("softhca: {msg}");
    ExitCode::from(1)
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Devinfo(a) => devinfo::run(&a),
        Command::Perf(a) => perf::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::BenchPeer(a) => bench::peer::run(&a),
        Command::Stream(a) => stream::run(&a),
        Command::Stat(a) => stat::run(&a),
        Command::Agent(a) => stat::agent(&a),
    }
}
