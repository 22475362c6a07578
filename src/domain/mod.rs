//! Pure types and rules of the engine: ids, status codes, the message contracts, the
//! outcomes of an order attempt and how each is acknowledged. No I/O lives here.

pub mod backoff;
pub mod events;
pub mod ids;
pub mod lsn;
pub(crate) mod mac;
pub mod message;
pub mod outcome;
pub mod payment;
pub mod purchase_token;
pub mod roles;
pub mod shard;
pub mod signature;
pub mod status;
