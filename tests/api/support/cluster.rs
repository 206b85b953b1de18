//! A PostgreSQL server of one test's own, for settings the shared server
//! does not have and cannot change without a restart that would cut every
//! other test off (`max_prepared_transactions`, which is 0 by default).
//! Made with the installed server's `initdb` and `pg_ctl`, on a free port,
//! in a temporary directory; stopped and removed when dropped.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use url::Url;

use super::pki::TempDir;

pub struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    pub port: u16,
    /// Last: removed once the server has stopped.
    _dir: TempDir,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("port", &self.port).finish()
    }
}

/// The newest installed server's programs (Debian keeps them per version).
fn server_bin() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<u32> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("no PostgreSQL server under {}: {e}", root.display()))
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let version = versions.last().expect("an installed PostgreSQL version");
    root.join(version.to_string()).join("bin")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// PostgreSQL refuses to run as root: as root, its programs run as the
/// `postgres` user (who then owns the directory).
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(mut command: Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Cluster {
    /// A fresh server with `settings` (`name=value`), accepting trusted
    /// connections on 127.0.0.1. Blocking: a few seconds of initdb.
    pub fn start(settings: &[&str]) -> Self {
        let dir = TempDir::new();
        let data = dir.path("data");
        if is_root() {
            let mut chown = Command::new("chown");
            chown.args(["-R", "postgres:postgres"]).arg(dir.path(""));
            run(chown, "give the cluster's directory to postgres");
        }
        let bin = server_bin();
        let mut initdb = as_server_user(&bin.join("initdb"));
        initdb
            .args([
                "--auth=trust",
                "--username=postgres",
                "--no-sync",
                "--encoding=UTF8",
            ])
            .arg("-D")
            .arg(&data);
        run(initdb, "initdb");
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().expect("its address").port()
        };
        let mut options = format!(
            "-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off"
        );
        for setting in settings {
            options.push_str(&format!(" -c {setting}"));
        }
        let mut start = as_server_user(&bin.join("pg_ctl"));
        start
            .arg("-D")
            .arg(&data)
            .args(["-w", "-t", "60", "-l"])
            .arg(dir.path("server.log"))
            .args(["-o", &options, "start"]);
        run(start, "pg_ctl start");
        Self {
            bin,
            data,
            port,
            _dir: dir,
        }
    }

    /// Its maintenance database, for `TestDb::create_on`.
    pub fn admin_url(&self) -> Url {
        Url::parse(&format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.port
        ))
        .expect("a URL")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut stop = as_server_user(&self.bin.join("pg_ctl"));
        stop.arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"]);
        let _ = stop.output();
    }
}
