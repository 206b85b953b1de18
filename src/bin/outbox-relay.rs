//! The reference relay worker binary: parse, validate, run.

use std::{process::ExitCode, time::Duration};

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
    let telemetry = match telemetry::init("outbox-relay", args.log.log_format) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("outbox-relay: telemetry set-up failed: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(stop) = shutdown::on_signals() else {
        return ExitCode::FAILURE;
    };
    let code = match relay::run(config, stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "outbox-relay failed");
            ExitCode::FAILURE
        }
    };
    // Traces still buffered at exit get this long to reach the collector.
    telemetry.shutdown(Duration::from_secs(5)).await;
    code
}
