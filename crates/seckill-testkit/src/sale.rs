//! `Sale`: a test's world set up in one expression: the settings it changes, and
//! the activity it sells.

use figment::providers::Serialized;
use figment::Figment;
use serde::Serialize;
use tokio_postgres::Client;

use crate::{builders, TestEnv};

type Override = Box<dyn FnOnce(Figment) -> Figment>;

/// A test's private world (`TestEnv`) with some settings changed and, if asked, one
/// activity created in its database:
///
/// ```ignore
/// let (env, mut db) = Sale::new()
///     .set("amqp.shards", 4)
///     .activity(42, 5_000, 16)
///     .open()
///     .await;
/// ```
#[derive(Default)]
#[must_use = "a sale is set up by `open` or `env`"]
pub struct Sale {
    overrides: Vec<Override>,
    /// Activity id, stock and buckets; SKU 1.
    activity: Option<(i64, i32, i16)>,
}

impl Sale {
    pub fn new() -> Sale {
        Sale::default()
    }

    /// Sets `key` (dotted, as in the config file: `amqp.shards`) to `value`.
    pub fn set(mut self, key: &str, value: impl Serialize + 'static) -> Sale {
        let key = key.to_owned();
        self.overrides
            .push(Box::new(move |f| f.merge(Serialized::default(&key, value))));
        self
    }

    /// Activity `activity` with one SKU, 1, of `stock` units over `buckets`, live
    /// now (`builders::activity`).
    pub fn activity(mut self, activity: i64, stock: i32, buckets: i16) -> Sale {
        self.activity = Some((activity, stock, buckets));
        self
    }

    /// The world alone, for a sale without an activity (else `open`).
    pub async fn env(self) -> TestEnv {
        assert!(self.activity.is_none(), "`open` creates the activity");
        let overrides = self.overrides;
        TestEnv::with(|f| overrides.into_iter().fold(f, |f, set| set(f))).await
    }

    /// The world and a client on its database, the activity created.
    pub async fn open(mut self) -> (TestEnv, Client) {
        let activity = self.activity.take();
        let env = self.env().await;
        let mut db = env.db().await;
        if let Some((activity, stock, buckets)) = activity {
            builders::activity(&mut db, activity, 1, stock, buckets).await;
        }
        (env, db)
    }
}
