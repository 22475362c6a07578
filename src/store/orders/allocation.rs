//! The turn a transaction takes at its bucket's inventory row (`AllocationTurn`), so
//! that the transactions of one bucket update the row in the order their batches
//! were formed and take pooled connections in that order too.

use tokio::sync::watch;

/// A transaction's turn at its bucket's inventory row. A bucket actor may run a
/// few transactions at once so that one's inserts overlap another's UPDATE and
/// COMMIT; the turns make their inventory UPDATEs happen one transaction at a time,
/// in the order the batches were formed. A transaction waits for its turn before its
/// first UPDATE and passes it on when every statement has succeeded and only COMMIT
/// is left, so the next one's UPDATE waits on the row lock at most for a COMMIT in
/// flight. A transaction that fails before that keeps the turn, and a batch split
/// after a failure `hold`s it through all its parts until its owner `finish`es it:
/// it keeps its place. (A COMMIT that
/// fails sends its messages to the retry queue, as with one transaction at a time.)
///
/// Connections are taken in turn order too (`seat`): a transaction takes a pooled
/// connection only once the one before it holds one. Otherwise the pool could be
/// held entirely by transactions waiting for turns whose owners wait for a
/// connection. Dropping an unfinished turn passes it on once the turn before it has.
pub struct AllocationTurn {
    pub(super) previous: Option<watch::Receiver<Stage>>,
    pub(super) mine: Option<watch::Sender<Stage>>,
    /// Set when the batch was split: its parts commit one by one and the turn
    /// passes only when the owner `finish`es it.
    pub(super) held: bool,
}

/// How far a turn has got; only ever moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    Waiting,
    Seated,
    Passed,
}

impl AllocationTurn {
    /// A turn that waits for nobody and that nobody waits for.
    pub fn free() -> Self {
        Self {
            previous: None,
            mine: None,
            held: false,
        }
    }

    /// The turn after the one whose receiver is `previous` (none: the first);
    /// returns it with the receiver the turn after it waits on.
    pub fn after(previous: Option<watch::Receiver<Stage>>) -> (Self, watch::Receiver<Stage>) {
        let (mine, next) = watch::channel(Stage::Waiting);
        let turn = Self {
            previous,
            mine: Some(mine),
            held: false,
        };
        (turn, next)
    }

    /// Returns when the turn before this one has reached `stage` (or is gone).
    pub(super) async fn reached(&mut self, stage: Stage) {
        if let Some(previous) = &mut self.previous {
            // An error means the previous turn is gone: it has passed.
            let _ = previous.wait_for(|s| *s >= stage).await;
        }
    }

    pub(super) fn advance(&mut self, stage: Stage) {
        if let Some(mine) = &self.mine {
            mine.send_if_modified(|s| {
                let forward = *s < stage;
                if forward {
                    *s = stage;
                }
                forward
            });
        }
    }

    /// Returns when this transaction may take a pooled connection.
    pub async fn wait_seat(&mut self) {
        self.reached(Stage::Seated).await;
    }

    /// This transaction holds a connection.
    pub fn seated(&mut self) {
        self.advance(Stage::Seated);
    }

    /// Returns when the inventory row is this transaction's.
    pub(super) async fn wait(&mut self) {
        self.reached(Stage::Passed).await;
    }

    /// The batch failed and is being split: keep the turn through all its parts.
    pub fn hold(&mut self) {
        self.held = true;
    }

    /// Only COMMIT is left: passes the turn on, after the turns before it (a
    /// transaction that never reached the row still keeps the order), unless the
    /// turn is held. Passing twice does nothing.
    pub async fn pass_on(&mut self) {
        if !self.held {
            self.wait().await;
            self.advance(Stage::Passed);
        }
    }

    /// The batch is done: passes the turn on if it has not been already.
    pub async fn finish(mut self) {
        self.held = false;
        self.pass_on().await;
    }
}

impl Drop for AllocationTurn {
    /// Passes the turn on behind the one before it. Without a runtime (the engine
    /// is shutting down) the order no longer matters: the successor sees this turn
    /// gone and goes ahead.
    fn drop(&mut self) {
        let (Some(mine), Some(mut previous)) = (self.mine.take(), self.previous.take()) else {
            return;
        };
        if *mine.borrow() == Stage::Passed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for stage in [Stage::Seated, Stage::Passed] {
                    let _ = previous.wait_for(|s| *s >= stage).await;
                    mine.send_if_modified(|s| {
                        let forward = *s < stage;
                        if forward {
                            *s = stage;
                        }
                        forward
                    });
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::timeout;

    use super::AllocationTurn;

    const BLOCKED: Duration = Duration::from_millis(100);
    const PROMPT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_turn_is_seated_and_reaches_the_row_only_after_the_one_before() {
        let (mut first, next) = AllocationTurn::after(None);
        let (mut second, _) = AllocationTurn::after(Some(next));
        assert!(timeout(BLOCKED, second.wait_seat()).await.is_err());
        first.seated();
        timeout(PROMPT, second.wait_seat())
            .await
            .expect("seat follows");
        assert!(timeout(BLOCKED, second.wait()).await.is_err());
        first.pass_on().await;
        timeout(PROMPT, second.wait()).await.expect("row follows");
    }

    #[tokio::test]
    async fn a_dropped_turn_passes_on_only_behind_the_one_before_it() {
        let (mut first, next) = AllocationTurn::after(None);
        let (second, next) = AllocationTurn::after(Some(next));
        let (mut third, _) = AllocationTurn::after(Some(next));
        drop(second);
        assert!(timeout(BLOCKED, third.wait_seat()).await.is_err());
        first.seated();
        timeout(PROMPT, third.wait_seat())
            .await
            .expect("seat follows");
        assert!(timeout(BLOCKED, third.wait()).await.is_err());
        first.finish().await;
        timeout(PROMPT, third.wait()).await.expect("row follows");
    }

    #[tokio::test]
    async fn a_held_turn_passes_only_when_finished() {
        let (mut first, next) = AllocationTurn::after(None);
        let (mut second, _) = AllocationTurn::after(Some(next));
        first.seated();
        first.hold();
        first.pass_on().await;
        assert!(timeout(BLOCKED, second.wait()).await.is_err());
        first.finish().await;
        timeout(PROMPT, second.wait()).await.expect("row follows");
    }
}
