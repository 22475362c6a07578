//! Acks of one consumer channel, sent as few `basic.ack` frames as correctness allows.
//!
//! A settled delivery's ack is handed here instead of being sent on its own. One task
//! per channel sends the frames, in order. A `multiple` ack settles *every*
//! outstanding tag up to its own, so it is sent only over a run of tags known to be
//! settled: delivery tags of a channel are dense (1, 2, 3, ...), and the run starts
//! right after the last tag already settled and stops at the first tag that is not,
//! whether it is still being worked on, being nacked, or was never handed to the
//! intake at all (a cancelled consumer's buffered deliveries can arrive after a newer
//! consumer's). A nacked or rejected delivery counts as settled only once its owner
//! reports it released, after its frame was sent. Acks waiting behind an unsettled
//! tag hold prefetch slots: past `hold_limit` of them they go out one by one, so a
//! slow message never stalls the consumer.

use std::collections::BTreeSet;

use std::sync::Arc;

use lapin::options::BasicAckOptions;
use lapin::Channel;
use tokio::sync::{mpsc, oneshot};

use crate::status::AckCounts;

/// One `basic.ack` to send: `multiple` settles every outstanding tag up to `tag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckFrame {
    pub tag: u64,
    pub multiple: bool,
    /// Deliveries it acks.
    pub messages: usize,
}

/// Which acks may go out now, and as which frames. Pure, so it can be tested against
/// a model of the broker.
#[derive(Debug)]
pub(crate) struct AckPlan {
    /// Every tag up to this one is settled with the broker, or covered by a frame
    /// already sent.
    frontier: u64,
    /// Acked by their owners, not sent yet.
    ready: BTreeSet<u64>,
    /// Above the frontier and already settled by a frame of their own (a nack, a
    /// reject, or an ack sent alone).
    done: BTreeSet<u64>,
    hold_limit: usize,
    /// Set once `done` outgrew its bound: a tag that never settles (it never reached
    /// the intake, or its nack failed) keeps the frontier from moving, so from then on
    /// every ack goes out alone and nothing is kept.
    unmerged: bool,
}

impl AckPlan {
    pub fn new(hold_limit: usize) -> Self {
        Self {
            frontier: 0,
            ready: BTreeSet::new(),
            done: BTreeSet::new(),
            hold_limit,
            unmerged: false,
        }
    }

    /// The delivery's effect is committed.
    pub fn acked(&mut self, tag: u64) {
        if tag > self.frontier {
            self.ready.insert(tag);
        }
    }

    /// The delivery was nacked or rejected, and that frame has been sent.
    pub fn released(&mut self, tag: u64) {
        if tag > self.frontier && !self.unmerged {
            self.done.insert(tag);
        }
    }

    /// Whether acks stopped being merged on this channel.
    pub fn unmerged(&self) -> bool {
        self.unmerged
    }

    /// Takes the frames to send now, in the order they must be sent.
    pub fn frames(&mut self) -> Vec<AckFrame> {
        if self.unmerged {
            return self.held();
        }
        let mut frames = Vec::new();
        let (mut top, mut messages) = (None, 0);
        loop {
            let next = self.frontier + 1;
            if self.ready.remove(&next) {
                top = Some(next);
                messages += 1;
            } else if !self.done.remove(&next) {
                break;
            }
            self.frontier = next;
        }
        if let Some(tag) = top {
            frames.push(AckFrame {
                tag,
                multiple: messages > 1,
                messages,
            });
        }
        if self.ready.len() > self.hold_limit {
            frames.extend(self.held());
        }
        // Each entry of `done` is a settled tag above one that is not; a handful is
        // normal (a nack in flight), thousands mean the gap will not close.
        if self.done.len() > DONE_BOUND.max(4 * self.hold_limit) {
            self.unmerged = true;
            self.done.clear();
        }
        frames
    }

    /// Every ready ack as a frame of its own, which may go out whatever is unsettled
    /// below it.
    pub fn held(&mut self) -> Vec<AckFrame> {
        let ready = std::mem::take(&mut self.ready);
        if !self.unmerged {
            self.done.extend(&ready);
        }
        ready
            .into_iter()
            .map(|tag| AckFrame {
                tag,
                multiple: false,
                messages: 1,
            })
            .collect()
    }
}

/// Settled tags kept above an unsettled one before merging is given up.
const DONE_BOUND: usize = 4096;

enum Event {
    Acked(u64),
    Released(u64),
    Flush(oneshot::Sender<()>),
}

/// Handle to the ack task of one consumer channel. The task ends once every handle
/// is dropped.
#[derive(Clone)]
pub struct Acks {
    // Unbounded, yet bounded by the prefetch window: one event per delivery the
    // broker let us have, plus a flush when stopping.
    events: mpsc::UnboundedSender<Event>,
}

impl Acks {
    /// Starts the ack task of `channel` on the current arbiter.
    pub fn start(
        channel: Channel,
        queue: Arc<str>,
        hold_limit: usize,
        counts: Arc<AckCounts>,
    ) -> Self {
        let (events, receiver) = mpsc::unbounded_channel();
        actix_rt::spawn(run(
            channel,
            queue,
            AckPlan::new(hold_limit),
            receiver,
            counts,
        ));
        Self { events }
    }

    /// The delivery's effect is committed: ack it.
    pub fn ack(&self, tag: u64) {
        let _ = self.events.send(Event::Acked(tag));
    }

    /// The delivery was nacked or rejected: its frame is out (or its channel gone).
    pub fn released(&self, tag: u64) {
        let _ = self.events.send(Event::Released(tag));
    }

    /// Sends every ack handed over before this call, alone if it cannot be merged,
    /// and waits until they are out: for stopping, when nothing more will settle.
    pub async fn flush(&self) {
        let (done, sent) = oneshot::channel();
        if self.events.send(Event::Flush(done)).is_ok() {
            let _ = sent.await;
        }
    }
}

async fn run(
    channel: Channel,
    queue: Arc<str>,
    mut plan: AckPlan,
    mut events: mpsc::UnboundedReceiver<Event>,
    counts: Arc<AckCounts>,
) {
    let mut flushed = Vec::new();
    while let Some(event) = events.recv().await {
        // Everything already queued joins this round: under load one frame acks many.
        let mut next = Some(event);
        while let Some(event) = next {
            match event {
                Event::Acked(tag) => plan.acked(tag),
                Event::Released(tag) => plan.released(tag),
                Event::Flush(done) => flushed.push(done),
            }
            next = events.try_recv().ok();
        }
        let was_unmerged = plan.unmerged();
        let mut frames = plan.frames();
        if !flushed.is_empty() {
            frames.extend(plan.held());
        }
        if plan.unmerged() && !was_unmerged {
            tracing::warn!(%queue, "a delivery tag never settled; acks on this channel are no longer merged");
        }
        // One at a time, in order: a later `multiple` ack overtaking an earlier frame
        // would make that frame's tag unknown to the broker, which closes the channel.
        for frame in frames {
            let options = BasicAckOptions {
                multiple: frame.multiple,
            };
            match channel.basic_ack(frame.tag, options).await {
                Ok(()) => {
                    counts.record_frame(frame.messages as u64);
                    metrics::counter!(crate::telemetry::names::INTAKE_ACK_FRAMES_TOTAL)
                        .increment(1);
                }
                Err(e) => {
                    // The effects are committed; redeliveries are answered by the inbox.
                    metrics::counter!(crate::telemetry::names::INTAKE_ACK_FAILURES_TOTAL)
                        .increment(frame.messages as u64);
                    tracing::warn!(%queue, messages = frame.messages, error = %e, "ack failed; the messages will be redelivered");
                }
            }
        }
        for done in flushed.drain(..) {
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The deliveries the broker holds unacked on the channel, and what a frame does
    /// to them.
    #[derive(Default)]
    struct Broker {
        unacked: BTreeSet<u64>,
    }

    impl Broker {
        /// Applies a frame as RabbitMQ does; returns the tags it acked, or an error
        /// where the broker would close the channel.
        fn apply(&mut self, frame: AckFrame) -> Result<Vec<u64>, String> {
            if !self.unacked.contains(&frame.tag) {
                return Err(format!("unknown delivery tag {}", frame.tag));
            }
            let acked: Vec<u64> = if frame.multiple {
                self.unacked.range(..=frame.tag).copied().collect()
            } else {
                vec![frame.tag]
            };
            for tag in &acked {
                self.unacked.remove(tag);
            }
            Ok(acked)
        }
    }

    /// The broker, the deliveries' owners, and what the owners asked for.
    struct Model {
        plan: AckPlan,
        broker: Broker,
        next_tag: u64,
        /// Handed to the intake, not settled yet.
        open: Vec<u64>,
        /// Delivered by the broker, never handed to the intake.
        lost: BTreeSet<u64>,
        to_ack: BTreeSet<u64>,
        acked: BTreeSet<u64>,
    }

    impl Model {
        fn new(hold_limit: usize) -> Self {
            Self {
                plan: AckPlan::new(hold_limit),
                broker: Broker::default(),
                next_tag: 1,
                open: Vec::new(),
                lost: BTreeSet::new(),
                to_ack: BTreeSet::new(),
                acked: BTreeSet::new(),
            }
        }

        fn deliver(&mut self, lost: bool) -> u64 {
            let tag = self.next_tag;
            self.next_tag += 1;
            self.broker.unacked.insert(tag);
            if lost {
                self.lost.insert(tag);
            } else {
                self.open.push(tag);
            }
            tag
        }

        fn ack(&mut self, tag: u64) {
            self.open.retain(|t| *t != tag);
            self.to_ack.insert(tag);
            self.plan.acked(tag);
        }

        fn release(&mut self, tag: u64) {
            // The nack goes out before the release is reported.
            self.open.retain(|t| *t != tag);
            self.broker.unacked.remove(&tag);
            self.plan.released(tag);
        }

        /// Sends the frames to the broker, checking each acks only deliveries their
        /// owners acked, each once.
        fn send(&mut self, frames: Vec<AckFrame>) -> Result<(), TestCaseError> {
            for frame in frames {
                let tags = self.broker.apply(frame).map_err(TestCaseError::fail)?;
                prop_assert_eq!(tags.len(), frame.messages);
                for tag in tags {
                    prop_assert!(
                        self.to_ack.contains(&tag),
                        "frame {:?} acked {} which its owner did not ack",
                        frame,
                        tag
                    );
                    prop_assert!(self.acked.insert(tag));
                }
            }
            prop_assert!(self.plan.ready.len() <= self.plan.hold_limit);
            Ok(())
        }

        fn send_now(&mut self) -> Result<(), TestCaseError> {
            let frames = self.plan.frames();
            self.send(frames)
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Deliver,
        /// A delivery the intake never sees.
        Lose,
        /// Settle the n-th open delivery (modulo their count): any order, as when a
        /// cancelled consumer's buffered deliveries run after a newer consumer's.
        Ack(usize),
        Release(usize),
        Send,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => Just(Step::Deliver),
            1 => Just(Step::Lose),
            6 => any::<usize>().prop_map(Step::Ack),
            2 => any::<usize>().prop_map(Step::Release),
            4 => Just(Step::Send),
        ]
    }

    proptest! {
        /// Whatever the order deliveries settle in, and even when some never reach
        /// the intake, no frame names a tag the broker does not hold, no frame acks a
        /// delivery its owner did not ack, no more than `hold_limit` acks wait, and
        /// after the stopping flush every ack has gone out.
        #[test]
        fn frames_ack_exactly_what_the_owners_acked(
            steps in proptest::collection::vec(step(), 1..400),
            hold_limit in 0usize..8,
        ) {
            let mut m = Model::new(hold_limit);
            for step in steps {
                match step {
                    Step::Deliver => { m.deliver(false); }
                    Step::Lose => { m.deliver(true); }
                    Step::Ack(n) if !m.open.is_empty() => m.ack(m.open[n % m.open.len()]),
                    Step::Release(n) if !m.open.is_empty() => m.release(m.open[n % m.open.len()]),
                    Step::Send => m.send_now()?,
                    _ => {}
                }
            }
            for tag in m.open.clone() {
                m.ack(tag);
            }
            m.send_now()?;
            let held = m.plan.held();
            m.send(held)?;
            prop_assert_eq!(&m.broker.unacked, &m.lost);
            prop_assert_eq!(&m.acked, &m.to_ack);
        }
    }

    #[test]
    fn contiguous_acks_go_out_as_one_frame_and_a_gap_holds_the_rest() {
        let mut plan = AckPlan::new(8);
        for tag in [1, 2, 3, 5, 6] {
            plan.acked(tag);
        }
        let first = AckFrame {
            tag: 3,
            multiple: true,
            messages: 3,
        };
        assert_eq!(plan.frames(), vec![first]);
        plan.acked(4);
        let second = AckFrame {
            tag: 6,
            multiple: true,
            messages: 3,
        };
        assert_eq!(plan.frames(), vec![second]);
    }

    #[test]
    fn a_tag_settled_later_never_lets_a_multiple_ack_pass_it() {
        // 7 is delivered but reaches the intake only after 8 and 9 settled.
        let mut plan = AckPlan::new(8);
        for tag in [1, 2, 3, 4, 5, 6, 8, 9] {
            plan.acked(tag);
        }
        assert_eq!(plan.frames().iter().map(|f| f.tag).max(), Some(6));
        plan.acked(7);
        assert_eq!(
            plan.frames(),
            vec![AckFrame {
                tag: 9,
                multiple: true,
                messages: 3
            }]
        );
    }

    #[test]
    fn acks_held_past_the_limit_go_out_one_by_one() {
        let mut plan = AckPlan::new(2);
        for tag in [2, 3] {
            plan.acked(tag);
        }
        assert!(plan.frames().is_empty());
        plan.acked(4);
        let frames = plan.frames();
        assert_eq!(frames.iter().map(|f| f.tag).collect::<Vec<_>>(), [2, 3, 4]);
        assert!(frames.iter().all(|f| !f.multiple));
    }

    #[test]
    fn a_tag_that_never_settles_ends_merging_without_growing_memory() {
        let mut m = Model::new(2);
        m.deliver(true);
        for _ in 0..3 * DONE_BOUND {
            let tag = m.deliver(false);
            m.ack(tag);
            m.send_now().unwrap();
            assert!(m.plan.done.len() <= DONE_BOUND + 1);
        }
        assert!(m.plan.unmerged());
        assert!(m.plan.done.is_empty());
        assert_eq!(m.broker.unacked, m.lost);
    }
}
