//! The reference relay worker binary: parse, validate, run.

use std::process::ExitCode;

use clap::Parser;
use outboxd::{config::EXIT_CONFIG, relay, shutdown, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let args = match relay::RelayArgs::try_parse() {
        Ok(args) => args,
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            let rendered = err.to_string();
            let line = rendered.lines().next().unwrap_or("invalid arguments");
            eprintln!("outbox-relay: {}", line.trim_start_matches("error: "));
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    let config = match args.validate() {
        Ok(config) => config,
        Err(reason) => {
            eprintln!("outbox-relay: invalid configuration: {reason}");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    telemetry::init(args.log.log_format);
    let Ok(stop) = shutdown::on_signals() else {
        return ExitCode::FAILURE;
    };
    match relay::run(config, stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "outbox-relay failed");
            ExitCode::FAILURE
        }
    }
}
