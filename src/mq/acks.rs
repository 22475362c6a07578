//! Acks of one consumer channel, sent as few `basic.ack` frames as correctness allows.
//!
//! A settled delivery's ack is handed here instead of being sent on its own. One task
//! per channel sends, in order, a single `multiple` ack for every settled delivery
//! below the lowest tag still unsettled. A `multiple` ack settles *every* outstanding
//! tag up to its own, so it may never cover a delivery still being worked on, nor one
//! whose nack or reject has not gone out yet: those stay in the unsettled set until
//! their owner reports them released, after its frame was sent. Acks waiting behind a
//! slow delivery count against the prefetch window; past `hold_limit` of them they go
//! out one by one, so a slow message never stalls the consumer.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lapin::options::BasicAckOptions;
use lapin::Channel;
use tokio::sync::{mpsc, oneshot};

/// Counts of what the ack tasks of an engine sent.
#[derive(Debug, Default)]
pub struct AckCounts {
    messages: AtomicU64,
    frames: AtomicU64,
}

impl AckCounts {
    /// Deliveries acked.
    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }
    /// `basic.ack` frames that acked them.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }
}

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
    /// Delivered, and neither acked nor released yet.
    unsettled: BTreeSet<u64>,
    /// Settled as acks, not sent yet.
    ready: BTreeSet<u64>,
    hold_limit: usize,
}

impl AckPlan {
    pub fn new(hold_limit: usize) -> Self {
        Self {
            unsettled: BTreeSet::new(),
            ready: BTreeSet::new(),
            hold_limit,
        }
    }

    pub fn delivered(&mut self, tag: u64) {
        self.unsettled.insert(tag);
    }

    pub fn acked(&mut self, tag: u64) {
        if self.unsettled.remove(&tag) {
            self.ready.insert(tag);
        }
    }

    /// The delivery was nacked or rejected, and that frame has been sent.
    pub fn released(&mut self, tag: u64) {
        self.unsettled.remove(&tag);
    }

    /// Takes the frames to send now, in the order they must be sent.
    pub fn frames(&mut self) -> Vec<AckFrame> {
        let mut frames = Vec::new();
        let held = match self.unsettled.first() {
            Some(&low) => self.ready.split_off(&low),
            None => BTreeSet::new(),
        };
        let below = std::mem::replace(&mut self.ready, held);
        if let Some(&tag) = below.last() {
            frames.push(AckFrame {
                tag,
                multiple: below.len() > 1,
                messages: below.len(),
            });
        }
        if self.ready.len() > self.hold_limit {
            frames.extend(
                std::mem::take(&mut self.ready)
                    .into_iter()
                    .map(|tag| AckFrame {
                        tag,
                        multiple: false,
                        messages: 1,
                    }),
            );
        }
        frames
    }
}

enum Event {
    Delivered(u64),
    Acked(u64),
    Released(u64),
    Flush(oneshot::Sender<()>),
}

/// Handle to the ack task of one consumer channel. The task ends once every handle
/// is dropped.
#[derive(Clone)]
pub struct Acks {
    // Unbounded, yet bounded by the prefetch window: at most two events per delivery
    // the broker let us have.
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

    /// Must be called for every delivery of the channel before it is settled: a
    /// delivery not registered here could be acked by a `multiple` ack.
    pub fn delivered(&self, tag: u64) {
        let _ = self.events.send(Event::Delivered(tag));
    }

    /// The delivery's effect is committed: ack it.
    pub fn ack(&self, tag: u64) {
        let _ = self.events.send(Event::Acked(tag));
    }

    /// The delivery was nacked or rejected (its frame already sent).
    pub fn released(&self, tag: u64) {
        let _ = self.events.send(Event::Released(tag));
    }

    /// Waits until every ack handed over before this call that can go out has been
    /// sent.
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
                Event::Delivered(tag) => plan.delivered(tag),
                Event::Acked(tag) => plan.acked(tag),
                Event::Released(tag) => plan.released(tag),
                Event::Flush(done) => flushed.push(done),
            }
            next = events.try_recv().ok();
        }
        // One at a time, in order: a later `multiple` ack overtaking an earlier frame
        // would make that frame's tag unknown to the broker, which closes the channel.
        for frame in plan.frames() {
            let options = BasicAckOptions {
                multiple: frame.multiple,
            };
            match channel.basic_ack(frame.tag, options).await {
                Ok(()) => {
                    counts.frames.fetch_add(1, Ordering::Relaxed);
                    counts
                        .messages
                        .fetch_add(frame.messages as u64, Ordering::Relaxed);
                    metrics::counter!("seckill_intake_ack_frames_total").increment(1);
                }
                Err(e) => {
                    // The effects are committed; redeliveries are answered by the inbox.
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

    /// What the broker holds unacked, and what a frame does to it.
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

    #[derive(Debug, Clone)]
    enum Step {
        Deliver,
        /// Settle the n-th unsettled delivery (modulo their count).
        Ack(usize),
        Release(usize),
        Send,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Deliver),
            3 => any::<usize>().prop_map(Step::Ack),
            1 => any::<usize>().prop_map(Step::Release),
            2 => Just(Step::Send),
        ]
    }

    /// Sends what the plan gives to the broker, checking each frame acks only what its
    /// owners acked, and each of those once.
    fn send(
        plan: &mut AckPlan,
        broker: &mut Broker,
        to_ack: &BTreeSet<u64>,
        acked: &mut BTreeSet<u64>,
    ) -> Result<(), TestCaseError> {
        for frame in plan.frames() {
            let tags = broker.apply(frame).map_err(TestCaseError::fail)?;
            prop_assert_eq!(tags.len(), frame.messages);
            for tag in tags {
                prop_assert!(
                    to_ack.contains(&tag),
                    "frame {:?} acked {} which was not settled as an ack",
                    frame,
                    tag
                );
                prop_assert!(acked.insert(tag));
            }
        }
        Ok(())
    }

    proptest! {
        /// Whatever the order deliveries settle in, no frame names a tag the broker
        /// does not hold, no frame acks a delivery that was not acked by its owner,
        /// and once all are settled every ack has gone out.
        #[test]
        fn frames_ack_exactly_the_settled_acks(
            steps in proptest::collection::vec(step(), 1..300),
            hold_limit in 0usize..8,
        ) {
            let mut plan = AckPlan::new(hold_limit);
            let mut broker = Broker::default();
            let mut next_tag = 1u64;
            let mut open: Vec<u64> = Vec::new();
            let mut to_ack = BTreeSet::new();
            let mut acked = BTreeSet::new();
            for step in steps {
                match step {
                    Step::Deliver => {
                        broker.unacked.insert(next_tag);
                        plan.delivered(next_tag);
                        open.push(next_tag);
                        next_tag += 1;
                    }
                    Step::Ack(n) if !open.is_empty() => {
                        let tag = open.remove(n % open.len());
                        to_ack.insert(tag);
                        plan.acked(tag);
                    }
                    Step::Release(n) if !open.is_empty() => {
                        // The nack goes out before the release is reported.
                        let tag = open.remove(n % open.len());
                        broker.unacked.remove(&tag);
                        plan.released(tag);
                    }
                    Step::Send => send(&mut plan, &mut broker, &to_ack, &mut acked)?,
                    _ => {}
                }
            }
            for tag in std::mem::take(&mut open) {
                to_ack.insert(tag);
                plan.acked(tag);
            }
            send(&mut plan, &mut broker, &to_ack, &mut acked)?;
            prop_assert!(broker.unacked.is_empty(), "left unacked: {:?}", broker.unacked);
            prop_assert_eq!(acked, to_ack);
        }
    }

    #[test]
    fn contiguous_acks_go_out_as_one_frame_and_a_gap_holds_the_rest() {
        let mut plan = AckPlan::new(8);
        for tag in 1..=6 {
            plan.delivered(tag);
        }
        for tag in [1, 2, 3, 5, 6] {
            plan.acked(tag);
        }
        assert_eq!(
            plan.frames(),
            vec![AckFrame {
                tag: 3,
                multiple: true,
                messages: 3
            }]
        );
        plan.acked(4);
        assert_eq!(
            plan.frames(),
            vec![AckFrame {
                tag: 6,
                multiple: true,
                messages: 3
            }]
        );
    }

    #[test]
    fn acks_held_past_the_limit_go_out_one_by_one() {
        let mut plan = AckPlan::new(2);
        for tag in 1..=4 {
            plan.delivered(tag);
        }
        for tag in [2, 3] {
            plan.acked(tag);
        }
        assert!(plan.frames().is_empty());
        plan.acked(4);
        let frames = plan.frames();
        assert_eq!(frames.iter().map(|f| f.tag).collect::<Vec<_>>(), [2, 3, 4]);
        assert!(frames.iter().all(|f| !f.multiple));
    }
}
