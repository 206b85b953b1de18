//! The outboxd server binary: parse, validate, run.

use std::{process::ExitCode, time::Duration};

use outbox_runtime::shutdown;
use outboxd::{
    config::{self, Cli, Command, LogFormat},
    server,
    telemetry::{self, Telemetry},
};

#[tokio::main]
async fn main() -> ExitCode {
    let (mut cli, sources): (Cli, _) = match config::parse_args("outboxd") {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    match cli.command {
        Some(Command::Migrate { mut database, log }) => {
            database.note_sources(&sources);
            let db = match database.validate() {
                Ok(db) => db,
                Err(reason) => return config::invalid_config("outboxd", &sources, &reason),
            };
            let Some(telemetry) = start_telemetry(log.log_format) else {
                return ExitCode::FAILURE;
            };
            let Ok(cancel) = shutdown::on_signals() else {
                return ExitCode::FAILURE;
            };
            let code = match server::migrate(&db, &cancel).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => start_failed(&err),
            };
            telemetry.shutdown(FLUSH_DEADLINE).await;
            code
        }
        None => {
            cli.serve.database.note_sources(&sources);
            let config = match cli.serve.validate() {
                Ok(config) => config,
                Err(reason) => return config::invalid_config("outboxd", &sources, &reason),
            };
            let Some(telemetry) = start_telemetry(cli.serve.log.log_format) else {
                return ExitCode::FAILURE;
            };
            let Ok(cancel) = shutdown::on_signals() else {
                return ExitCode::FAILURE;
            };
            let code = match server::Server::build(config, &cancel).await {
                Ok(server) => report(server.serve(cancel).await),
                // Asked to stop before serving: a clean stop, like one after.
                Err(server::StartError::Interrupted) => {
                    tracing::info!("stopped before start-up finished");
                    ExitCode::SUCCESS
                }
                Err(err) => start_failed(&err),
            };
            telemetry.shutdown(FLUSH_DEADLINE).await;
            code
        }
    }
}

/// Traces still buffered at exit get this long to reach the collector.
const FLUSH_DEADLINE: Duration = Duration::from_secs(5);

fn start_telemetry(format: LogFormat) -> Option<Telemetry> {
    match telemetry::init("outboxd", "outboxd", format) {
        Ok(telemetry) => Some(telemetry),
        Err(err) => {
            eprintln!("outboxd: telemetry set-up failed: {err:#}");
            None
        }
    }
}

/// One line saying why, and the exit code that sorts it (see `StartError`).
fn start_failed(err: &server::StartError) -> ExitCode {
    tracing::error!(error = format!("{err:#}"), "outboxd cannot start");
    ExitCode::from(err.exit_code())
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "outboxd failed");
            ExitCode::FAILURE
        }
    }
}
