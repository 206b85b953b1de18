//! The reference relay worker binary: parse, validate, run.

use std::{process::ExitCode, time::Duration};

use outbox_relay as relay;
use outbox_runtime::{cli as config, shutdown, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let (args, sources): (relay::RelayArgs, _) = match config::parse_args("outbox-relay") {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let config = match args.validate() {
        Ok(config) => config,
        Err(reason) => return config::invalid_config("outbox-relay", &sources, &reason),
    };
    // Bound before anything connects: a taken port is a configuration error.
    let metrics_listener = match relay::bind_metrics(&config.metrics_listen).await {
        Ok(listener) => listener,
        Err(reason) => return config::invalid_config("outbox-relay", &sources, &reason),
    };
    let telemetry = match telemetry::init("outbox-relay", "outbox_relay", args.log.log_format) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("outbox-relay: telemetry set-up failed: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(stop) = shutdown::on_signals() else {
        return ExitCode::FAILURE;
    };
    let code = match relay::run(config, metrics_listener, stop).await {
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
