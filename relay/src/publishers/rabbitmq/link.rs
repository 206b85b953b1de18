//! The process's one RabbitMQ connection, made on demand and again after it is
//! lost, and the broker's state as last logged, so each change shows once.

use std::sync::{Arc, Mutex as StdMutex, PoisonError};

use lapin::{Connection, ConnectionProperties, tcp::OwnedTLSConfig};
use tokio::sync::Mutex;

use super::config::redact_url;

/// Connects to `url` under `name`, which `rabbitmqctl list_connections name`
/// shows, so operators see whose connection it is. `tls` applies to an
/// amqps:// URL (its CA is trusted besides the system's roots).
pub async fn connect(url: &str, tls: &OwnedTLSConfig, name: &str) -> lapin::Result<Connection> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let runtime = lapin::runtime::default_runtime()?;
    Connection::connect_with_config(url, properties, tls.clone(), runtime).await
}

/// The shared connection and its reported state.
#[derive(Debug)]
pub(super) struct Link {
    url: String,
    tls: OwnedTLSConfig,
    name: String,
    connection: Mutex<Option<Arc<Connection>>>,
    /// Last reported state, so each change is logged once, not each retry.
    state: StdMutex<State>,
}

/// The broker as the relay last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    Untried,
    Connecting,
    /// A slot has a channel ready to publish on.
    Up,
    /// Connecting or opening a channel failed, for this reason.
    Down(String),
}

/// A state change worth a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Connecting,
    Connected,
    Unavailable,
    /// Still down, for another reason than the one last logged.
    StillUnavailable,
}

impl State {
    /// The state after `to`, and the line it is worth. `Connecting` counts only
    /// as the first attempt: later attempts show as a change of reason or as
    /// connected.
    fn next(&self, to: State) -> (State, Option<Change>) {
        let change = match (self, &to) {
            (State::Untried, State::Connecting) => Some(Change::Connecting),
            (_, State::Connecting) => return (self.clone(), None),
            (State::Down(was), State::Down(now)) if was == now => None,
            (State::Down(_), State::Down(_)) => Some(Change::StillUnavailable),
            (_, State::Down(_)) => Some(Change::Unavailable),
            (State::Up, State::Up) => None,
            (_, State::Up) => Some(Change::Connected),
            (_, State::Untried) => None,
        };
        (to, change)
    }
}

impl Link {
    pub fn new(url: String, tls: OwnedTLSConfig, name: String) -> Self {
        Self {
            url,
            tls,
            name,
            connection: Mutex::new(None),
            state: StdMutex::new(State::Untried),
        }
    }

    /// The live connection, connecting first when there is none (or it died).
    pub async fn connection(&self) -> Result<Arc<Connection>, String> {
        let mut slot = self.connection.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| c.status().connected()) {
            return Ok(Arc::clone(conn));
        }
        if slot.take().is_some() {
            self.report(State::Down("connection lost".into()));
        }
        self.report(State::Connecting);
        match connect(&self.url, &self.tls, &self.name).await {
            Ok(conn) => {
                let conn = Arc::new(conn);
                *slot = Some(Arc::clone(&conn));
                Ok(conn)
            }
            Err(err) => Err(err.to_string()),
        }
    }

    /// Logs the broker's state when it changes: the first attempt, connected,
    /// unavailable with the reason, and a new reason while still down.
    pub fn report(&self, to: State) {
        let reason = match &to {
            State::Down(reason) => Some(reason.clone()),
            _ => None,
        };
        let change = {
            // A panic elsewhere cannot leave a `State` half-written.
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let (next, change) = state.next(to);
            *state = next;
            change
        };
        let Some(change) = change else {
            return;
        };
        let broker = redact_url(&self.url);
        match change {
            Change::Connecting => tracing::info!(%broker, "connecting to RabbitMQ"),
            Change::Connected => tracing::info!(%broker, "connected to RabbitMQ"),
            Change::Unavailable => tracing::warn!(
                %broker,
                reason,
                "RabbitMQ unavailable; holding claims until it is back"
            ),
            Change::StillUnavailable => {
                tracing::warn!(%broker, reason, "RabbitMQ still unavailable")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_state_is_logged_from_the_first_attempt_and_on_each_change() {
        let down = |reason: &str| State::Down(reason.into());
        let mut state = State::Untried;
        let mut logged = Vec::new();
        for to in [
            State::Connecting,
            down("refused"),
            State::Connecting,
            down("refused"),
            down("refused"),
            down("timed out"),
            State::Up,
            State::Up,
            State::Connecting,
            down("connection lost"),
            down("refused"),
            State::Up,
        ] {
            let (next, change) = state.next(to);
            state = next;
            logged.extend(change);
        }
        use Change::*;
        assert_eq!(
            logged,
            [
                Connecting,
                Unavailable,
                StillUnavailable,
                Connected,
                Unavailable,
                StillUnavailable,
                Connected
            ]
        );
        assert_eq!(State::Untried.next(State::Up), (State::Up, Some(Connected)));
    }
}
