//! The background services and what runs them: the supervisor (with its messages),
//! the runner every service is driven by (`runner`: `run_once` on an interval, backoff
//! after a failure), and the services themselves: outbox publisher, sweeper,
//! compensation worker, reconciler, retention, gauge sampler and readiness monitor.
//! Their work lives in PostgreSQL rows, never only in a mailbox.

pub mod children;
pub mod compensation_worker;
pub mod gauges;
pub mod node_lease;
pub mod outbox_publisher;
pub mod readiness;
pub mod reconciler;
pub mod retention;
pub mod runner;
pub mod supervisor;
pub mod sweeper;
