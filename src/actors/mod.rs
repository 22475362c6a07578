//! The actors of the design card. Intake → DbPermits → Reservation → Bucket → the order
//! transaction; each file owns one actor and its messages.

pub mod bucket;
pub mod compensation_worker;
pub mod db_permits;
pub mod gauges;
pub mod intake;
pub mod maintenance;
pub mod outbox_publisher;
pub mod readiness;
pub mod reconciler;
pub mod registry;
pub mod reservation;
pub mod supervisor;
pub mod sweeper;
