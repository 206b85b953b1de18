//! The only place with SQL. Each configured outbox gets its statements built once,
//! at start, with its table name quoted; every RPC is then one autocommit
//! statement, so no transaction is ever held across a network call.

mod adopt;
mod connect;
mod error;
mod postgres;
mod statements;

pub use adopt::AdoptMode;
pub use connect::{ConnectError, ConnectSettings, connect};
pub use error::StoreError;
pub use postgres::PgStore;
