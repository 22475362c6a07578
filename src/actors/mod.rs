//! The pipeline actors: Intake → DbPermits → Reservation → Bucket → the order
//! transaction. Each file owns one actor and its messages. The background services
//! and their supervisor live in `services/`.

pub mod bucket;
pub mod db_permits;
pub mod intake;
pub mod lanes;
pub mod registry;
pub mod reservation;
