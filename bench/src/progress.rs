//! The progress bar: one tick per measured step, log lines printed above it.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(steps: u64) -> Self {
        let bar = ProgressBar::new(steps);
        let style = ProgressStyle::with_template(
            "{elapsed_precise:.dim} [{bar:30}] {pos}/{len} {wide_msg}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(250));
        Self { bar }
    }

    /// Names the step now running.
    pub fn doing(&self, what: impl Into<String>) {
        self.bar.set_message(what.into());
    }

    pub fn done_step(&self) {
        self.bar.inc(1);
    }

    /// A line above the bar (also when stderr is not a terminal).
    pub fn log(&self, line: impl AsRef<str>) {
        if self.bar.is_hidden() {
            eprintln!("{}", line.as_ref());
        } else {
            self.bar.println(line.as_ref());
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
