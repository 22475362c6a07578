//! The actors of the design card. Intake → DbPermits → Reservation → Bucket → the order
//! transaction; each file owns one actor and its messages.

pub mod bucket;
pub mod db_permits;
pub mod intake;
pub mod registry;
pub mod reservation;
