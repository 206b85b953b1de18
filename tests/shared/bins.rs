//! Where the binaries under test are.
//!
//! `outboxd` is this package's binary, so Cargo builds it for the tests and
//! names it in `CARGO_BIN_EXE_outboxd`. `outbox-relay` is looked up in one
//! place, here: `OUTBOX_RELAY_BIN` if set, else the file next to `outboxd`
//! (same target directory and profile), which `cargo build --workspace` or
//! `scripts/test` builds.

use std::path::PathBuf;

/// The outboxd binary Cargo built for these tests.
pub fn outboxd() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_outboxd"))
}

/// The outbox-relay binary; fails the test saying how to build it when it is missing.
pub fn relay() -> PathBuf {
    if let Some(path) = std::env::var_os("OUTBOX_RELAY_BIN") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "OUTBOX_RELAY_BIN is {} but there is no file there",
            path.display()
        );
        return path;
    }
    let path = outboxd().with_file_name(format!("outbox-relay{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "outbox-relay is not built: no {} next to outboxd. Run `cargo build --workspace` \
         (or `scripts/test`) first, or point OUTBOX_RELAY_BIN at the binary",
        path.display()
    );
    path
}

/// The outboxctl binary, found like [`relay`]: `OUTBOXCTL_BIN` if set, else
/// the file next to `outboxd`, which `cargo build --workspace` builds.
pub fn outboxctl() -> PathBuf {
    if let Some(path) = std::env::var_os("OUTBOXCTL_BIN") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "OUTBOXCTL_BIN is {} but there is no file there",
            path.display()
        );
        return path;
    }
    let path = outboxd().with_file_name(format!("outboxctl{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "outboxctl is not built: no {} next to outboxd. Run `cargo build --workspace` \
         (or `scripts/test`) first, or point OUTBOXCTL_BIN at the binary",
        path.display()
    );
    path
}
