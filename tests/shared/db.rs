//! A PostgreSQL database of one test's own: created empty, reached straight or
//! through a proxy, and dropped (with its connections) when the last handle
//! goes, also when the test panics.

use std::{net::SocketAddr, sync::Arc};

use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, postgres::PgPoolOptions};
use url::Url;
use uuid::Uuid;

/// Where tests create and drop their databases, unless `OUTBOXD_TEST_ADMIN_URL` says otherwise.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

fn admin_url() -> Url {
    let raw = std::env::var("OUTBOXD_TEST_ADMIN_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.into());
    Url::parse(&raw).expect("OUTBOXD_TEST_ADMIN_URL must be a postgres:// URL")
}

/// A database of its own for one test.
#[derive(Debug)]
pub struct TestDb {
    pub name: String,
    /// Direct connection to the test database, for the test's own SQL.
    pub pool: PgPool,
    url: Url,
    admin: Url,
    /// Dropped with its server instead (a private cluster's), which may be
    /// gone by then.
    goes_with_server: bool,
}

impl TestDb {
    pub async fn create() -> Arc<Self> {
        Self::create_on(admin_url()).await
    }

    /// A database on the server `admin` (a maintenance database's URL)
    /// reaches: for a test that needs a server configured its own way.
    pub async fn create_on(admin: Url) -> Arc<Self> {
        Self::create_in(admin, false).await
    }

    /// A database on a server of the test's own (`admin` is its maintenance
    /// database's URL), not dropped at the end: the server and its files go
    /// when the test ends, possibly before this handle does.
    pub async fn create_on_private(admin: Url) -> Arc<Self> {
        Self::create_in(admin, true).await
    }

    async fn create_in(admin: Url, goes_with_server: bool) -> Arc<Self> {
        let name = format!("outboxd_test_{}", Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(admin.as_str())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach PostgreSQL at {}:{} ({e}); start it with `scripts/test`, or \
                     `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, \
                     or point OUTBOXD_TEST_ADMIN_URL at a server",
                    admin.host_str().unwrap_or("?"),
                    admin.port().unwrap_or(5432),
                )
            });
        run(&mut conn, format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("create the test database {name}: {e}"));
        let _ = conn.close().await;
        let mut url = admin.clone();
        url.set_path(&name);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect(url.as_str())
            .await
            .expect("connect to the test database");
        Arc::new(Self {
            name,
            pool,
            url,
            admin,
            goes_with_server,
        })
    }

    /// The PostgreSQL server's address, where a proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.url
            .socket_addrs(|| Some(5432))
            .expect("resolve the PostgreSQL host")
            .into_iter()
            .next()
            .expect("the PostgreSQL host has an address")
    }

    /// The test database's URL, straight to PostgreSQL.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// The test database's URL with its host and port replaced by `addr` (a proxy's).
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let mut url = self.url.clone();
        url.set_host(Some(&addr.ip().to_string()))
            .expect("an IP address is a valid host");
        url.set_port(Some(addr.port()))
            .expect("a postgres URL takes a port");
        url.to_string()
    }

    pub async fn execute(&self, sql: &str) {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("test SQL failed: {e}\n{sql}"));
    }

    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("test SQL failed: {e}\n{sql}"))
    }
}

async fn run(conn: &mut PgConnection, sql: String) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(sql))
        .execute(conn)
        .await
        .map(drop)
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.goes_with_server {
            return;
        }
        let admin = self.admin.to_string();
        let name = self.name.clone();
        // Drop may run inside a runtime (or while a test unwinds), so the cleanup
        // gets a thread and a runtime of its own.
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&admin)
                    .await
                    .map_err(|e| e.to_string())?;
                run(
                    &mut conn,
                    format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
                )
                .await
                .map_err(|e| e.to_string())?;
                let _ = conn.close().await;
                Ok(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!("warning: dropping test database {} panicked", self.name),
        }
    }
}
