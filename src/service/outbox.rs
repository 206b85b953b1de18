//! Outboxes resolved once at the edge: a request's name becomes a handle (the
//! outbox's store and its waiting claimers) before any work is done, and
//! nothing below looks the name up again.

use std::{collections::HashMap, sync::Arc};

use crate::{
    store::{OutboxStore, StoreError},
    wakeup::Waiters,
};

/// One configured outbox: its storage and its long-polling claimers.
#[derive(Debug, Clone)]
pub struct Outbox<S> {
    pub store: S,
    pub waiters: Arc<Waiters>,
}

impl<S: OutboxStore> Outbox<S> {
    /// The name clients use, and metrics and logs report.
    pub fn name(&self) -> &str {
        &self.store.spec().name
    }
}

/// The configured outboxes, in configuration order, found by name.
#[derive(Debug, Clone)]
pub struct Outboxes<S> {
    list: Arc<[Outbox<S>]>,
    by_name: Arc<HashMap<String, usize>>,
}

impl<S: OutboxStore> Outboxes<S> {
    /// One handle per store handle, each with a wake-up queue of its own.
    pub fn new(stores: impl IntoIterator<Item = S>) -> Self {
        let list: Arc<[Outbox<S>]> = stores
            .into_iter()
            .map(|store| Outbox {
                store,
                waiters: Waiters::new(),
            })
            .collect();
        let by_name = list
            .iter()
            .enumerate()
            .map(|(i, outbox)| (outbox.name().to_owned(), i))
            .collect();
        Self {
            list,
            by_name: Arc::new(by_name),
        }
    }

    /// The outbox a request names; an unknown name is the client's mistake
    /// (NOT_FOUND), found before any work is done.
    pub fn get(&self, name: &str) -> Result<&Outbox<S>, StoreError> {
        self.by_name
            .get(name)
            .map(|&i| &self.list[i])
            .ok_or_else(|| StoreError::UnknownOutbox(name.to_owned()))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Outbox<S>> {
        self.list.iter()
    }
}
