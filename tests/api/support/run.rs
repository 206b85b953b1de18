//! The real outboxd binary run to completion, for what it does before (or
//! instead of) serving: exit codes and what it says.

use std::process::Output;

use tokio::process::Command;

use super::{secs, within};
use crate::shared::bins;

/// Runs the real binary to completion (bounded) with the given arguments and
/// extra environment; `OUTBOXD_*` and `DATABASE_URL` from the caller's
/// environment are removed so only the test's settings apply.
pub async fn run_outboxd(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(bins::outboxd());
    for (key, _) in std::env::vars() {
        if key.starts_with("OUTBOXD_") || key == "DATABASE_URL" {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .kill_on_drop(true);
    within(secs(60), "outboxd exits by itself", command.output())
        .await
        .expect("run outboxd")
}

/// The log and error output together: start-up failures are logged (stdout),
/// configuration errors printed before logging starts (stderr).
pub fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
