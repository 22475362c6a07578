//! COMMIT and what its failure means: a COMMIT refused for a reason of the
//! transaction itself did not commit; any other failure leaves the outcome unknown
//! (seed §7.5). The order flow, payments and sweeps commit through here, so none of
//! them imports another's module for it.

use tokio_postgres::Transaction;

use super::{StoreError, Warnings};

/// A COMMIT refused for a reason of the transaction itself (serialization, a
/// deferred constraint, a data error, an aborted transaction) did not commit. Any
/// other failure may have committed (§7.5): no answer at all, and also an answer
/// like `57P01` from a backend terminated *while* committing, which PostgreSQL sends
/// after the commit record may already be durable.
///
/// A COMMIT answered with a warning is not taken as committed either: that is how
/// PostgreSQL answers when its wait for a synchronous standby was cancelled
/// (committed locally, maybe not replicated; `Warnings`). Acked, such an order
/// would be lost by a fail-over right after.
pub(crate) async fn commit(tx: Transaction<'_>, warnings: &Warnings) -> Result<(), StoreError> {
    let before = warnings.seen();
    tx.commit().await.map_err(commit_failed)?;
    unwarned(warnings, before)
}

/// `Ok` unless the connection's warning count moved past `before` (see `commit`).
pub(crate) fn unwarned(warnings: &Warnings, before: u64) -> Result<(), StoreError> {
    if warnings.seen() == before {
        Ok(())
    } else {
        Err(StoreError::CommitWarned)
    }
}

/// Whether a failed COMMIT may have committed (see `commit`).
pub(super) fn commit_failed(e: tokio_postgres::Error) -> StoreError {
    let rolled_back = e.code().is_some_and(|c| {
        let c = c.code();
        c.starts_with("40") || c.starts_with("23") || c.starts_with("22") || c.starts_with("25")
    });
    if rolled_back {
        StoreError::Db(e)
    } else {
        StoreError::CommitOutcomeUnknown(e)
    }
}
