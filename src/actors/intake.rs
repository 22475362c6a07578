//! Intake owns one consumed queue: it decodes and validates each delivery, takes a DB
//! permit before dispatching (and so stops pulling while none is free), hands the
//! message to the queue's work (`IntakeWork`: the order pipeline, payment callbacks),
//! and settles the delivery from the outcome: ack after commit, delayed retry for
//! transient failures and unknown commits, dead-letter with a reason for poison.
//! Nothing is acked before its effect (or its recorded rejection) is committed. Acks
//! go through the channel's `Acks` task, which merges contiguous ones into one frame.

use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::LocalBoxFuture;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use uuid::Uuid;

use super::bucket::BucketKey;
use super::db_permits::{Acquire, DbPermits, Permit};
use super::lanes::LaneRouter;
use super::registry::Route;
use super::reservation::ProcessOrder;
use crate::config::AmqpSettings;
use crate::domain::message::{OrderCreateMessage, PoisonReason};
use crate::domain::outcome::{disposition, Disposition, ErrorClass};
use crate::domain::payment::PaymentCallback;
use crate::domain::signature::{self, SIGNATURE_HEADER};
use crate::mq::acks::Acks;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::settlement::{ack, dead_letter, retry, Budget, IntakeRoutes, Outlet};
use crate::mq::topology::declare_topology;
use crate::mq::{self, MqError};
use crate::services::supervisor::{ChildFailed, StopChild};
use crate::status::{AckCounts, InFlight, IntakeStats, Live, Readiness};
use crate::store::payments::apply_callback;

/// The queue-specific part of an intake.
pub trait IntakeWork: Clone + Unpin + Send + 'static {
    type Msg: 'static;
    /// Metric label of the queue kind ("order_create", "payment_callback").
    const KIND: &'static str;
    /// Decodes and validates a delivery (its body, and its headers where the queue's
    /// contract has some); an error makes the message poison.
    fn decode(&self, body: &[u8], properties: &BasicProperties) -> Result<Self::Msg, PoisonReason>;
    /// Brings the message to a committed outcome (returned as its metric label) or a
    /// classified error.
    fn process(&self, msg: Self::Msg) -> LocalBoxFuture<'static, Result<&'static str, ErrorClass>>;
}

/// `order.create`: each message goes to the actor of its reservation, on the lane of
/// its bucket.
#[derive(Clone)]
pub struct OrderWork {
    pub lanes: LaneRouter,
    /// The consumed queue, recorded in the inbox.
    pub topic: Arc<str>,
    /// The engine's live figures: whose orders are logged at INFO.
    pub live: Arc<Live>,
    /// `amqp.order_signing_secret`: when set, only signed messages are orders.
    pub signing_secret: Option<Arc<[u8]>>,
}

impl IntakeWork for OrderWork {
    type Msg = OrderCreateMessage;
    const KIND: &'static str = "order_create";

    fn decode(
        &self,
        body: &[u8],
        properties: &BasicProperties,
    ) -> Result<OrderCreateMessage, PoisonReason> {
        if let Some(secret) = &self.signing_secret {
            let header = mq::text_header(properties, SIGNATURE_HEADER);
            signature::check(secret, body, header.as_deref())?;
        }
        OrderCreateMessage::decode(body)
    }

    fn process(
        &self,
        msg: OrderCreateMessage,
    ) -> LocalBoxFuture<'static, Result<&'static str, ErrorClass>> {
        let reservations = self.lanes.reservations(&BucketKey::of(&msg)).clone();
        let (topic, live) = (self.topic.clone(), self.live.clone());
        Box::pin(async move {
            let (message_id, reservation_id, activity_id) =
                (msg.message_id, msg.reservation_id, msg.activity_id);
            let route = Route {
                key: msg.reservation_id,
                msg: ProcessOrder { msg, topic },
            };
            let outcome = match reservations.send(route).await {
                Ok(Ok(result)) => result?,
                Ok(Err(_)) | Err(_) => return Err(ErrorClass::Unavailable("actor_unavailable")),
            };
            metrics::counter!(crate::telemetry::names::ORDERS_TOTAL, "outcome" => outcome.label())
                .increment(1);
            crate::order_log!(live.traced(), activity_id, %message_id, %reservation_id, outcome = outcome.label(), order_id = outcome.order_id, "message processed");
            Ok(outcome.label())
        })
    }
}

/// How often an intake looks at the readiness flag.
const READINESS_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// `payment.callback`: each callback runs its own transaction (no ordering needed: the
/// inbox and the conditional UPDATE make any interleaving safe).
#[derive(Clone)]
pub struct PaymentWork {
    pub pool: crate::store::Pool,
    pub consumer_group: Arc<str>,
    pub topic: Arc<str>,
}

impl IntakeWork for PaymentWork {
    type Msg = PaymentCallback;
    const KIND: &'static str = "payment_callback";

    fn decode(&self, body: &[u8], _: &BasicProperties) -> Result<PaymentCallback, PoisonReason> {
        PaymentCallback::decode(body)
    }

    fn process(
        &self,
        cb: PaymentCallback,
    ) -> LocalBoxFuture<'static, Result<&'static str, ErrorClass>> {
        let work = self.clone();
        Box::pin(async move {
            let result = async {
                let mut conn = work.pool.get().await?;
                let applied =
                    apply_callback(&mut conn, &work.consumer_group, &work.topic, &cb).await;
                conn.observe(applied)
            }
            .await;
            let outcome = result.map_err(|e| {
                tracing::debug!(order_id = cb.order_id, sqlstate = e.sqlstate(), error = %e, "payment transaction failed");
                e.class()
            })?;
            let label = if outcome.duplicate {
                "duplicate"
            } else {
                outcome.result.label()
            };
            metrics::counter!(crate::telemetry::names::PAYMENTS_TOTAL, "result" => label)
                .increment(1);
            tracing::debug!(
                order_id = cb.order_id,
                result = label,
                "payment callback processed"
            );
            Ok(label)
        })
    }
}

/// Where and how an intake consumes.
#[derive(Clone)]
pub struct IntakeConfig {
    /// The name the supervisor knows it by.
    pub name: String,
    /// The order shard this intake consumes (None: the payment queue), whose
    /// ownership it follows (`status::Shards`).
    pub shard: Option<u16>,
    pub amqp: AmqpSettings,
    pub prefetch: u16,
    pub routes: IntakeRoutes,
    /// How long deliveries already taken may take to settle when stopping.
    pub grace: std::time::Duration,
}

pub struct Intake<W: IntakeWork> {
    config: IntakeConfig,
    stats: Arc<IntakeStats>,
    permits: Addr<DbPermits>,
    work: W,
    supervisor: Option<Recipient<ChildFailed>>,
    /// Set once connected: the connection, the consumer channel and its tag, and the
    /// confirm channel for retry and dead-letter copies.
    link: Option<Link>,
    stopping: bool,
    /// Consumers are cancelled while the engine is not ready.
    readiness: Arc<Readiness>,
    paused: bool,
    resuming: bool,
    /// Consumer streams cancelled for a pause whose end is still to come.
    cancelled_streams: usize,
    /// Deliveries came since the consumer last registered: it is the active one.
    active: bool,
    /// Active on a shard another instance owns: cancel and register again.
    handing_back: bool,
    /// When this intake last handed its shard back: at most one hand-back per
    /// `HAND_BACK_EVERY`, so two instances that both think a third (crashed) owns a
    /// shard do not pass it to and fro until the third drops out of the ranks.
    handed_back_at: Option<std::time::Instant>,
}

/// The least time between two hand-backs of one intake.
const HAND_BACK_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

struct Link {
    connection: Arc<lapin::Connection>,
    channel: Channel,
    consumer_tag: String,
    /// Built once per connection and shared by every delivery's task.
    outlet: Rc<Outlet>,
}

impl<W: IntakeWork> Intake<W> {
    pub fn new(
        config: IntakeConfig,
        stats: Arc<IntakeStats>,
        permits: Addr<DbPermits>,
        work: W,
        supervisor: Option<Recipient<ChildFailed>>,
        readiness: Arc<Readiness>,
    ) -> Self {
        Self {
            config,
            stats,
            permits,
            work,
            supervisor,
            link: None,
            stopping: false,
            readiness,
            paused: false,
            resuming: false,
            cancelled_streams: 0,
            active: false,
            handing_back: false,
            handed_back_at: None,
        }
    }

    /// Deliveries arrived: this consumer is the active one of its shard. If another
    /// instance owns the shard, hand it back (the poll cancels and registers again).
    fn note_active(&mut self) {
        let Some(shard) = self.config.shard else {
            return;
        };
        if !self.active {
            self.active = true;
            if self.readiness.shards().acquired(shard) {
                let label = shard.to_string();
                metrics::counter!(crate::telemetry::names::SHARD_ACQUIRED_TOTAL, "shard" => label)
                    .increment(1);
                tracing::info!(shard, "active on the shard");
            }
        }
        let cooling = self
            .handed_back_at
            .is_some_and(|at| at.elapsed() < HAND_BACK_EVERY);
        if !self.handing_back && !cooling && !self.readiness.shards().owns(shard) {
            self.handing_back = true;
            self.handed_back_at = Some(std::time::Instant::now());
            tracing::info!(
                shard,
                "active on a shard another instance owns; handing it back"
            );
        }
    }

    /// The consumer was cancelled or its connection lost: no longer active.
    fn note_inactive(&mut self) {
        let Some(shard) = self.config.shard else {
            return;
        };
        if std::mem::take(&mut self.active) && self.readiness.shards().lost(shard) {
            let label = shard.to_string();
            metrics::counter!(crate::telemetry::names::SHARD_LOST_TOTAL, "shard" => label)
                .increment(1);
        }
    }

    /// Cancels the consumer while the engine is not ready or paused by an operator;
    /// consumes again once it is ready and resumed.
    fn follow_readiness(&mut self, ctx: &mut Context<Self>) {
        if self.stopping || self.resuming {
            return;
        }
        if self.link.is_none() {
            return;
        }
        if self.paused {
            // Not consuming: nothing to hand back.
            self.handing_back = false;
        }
        // A hand-back is a pause of one poll: the cancel lets RabbitMQ activate the
        // next consumer, and consuming again puts this one at the back of the line.
        let ready = self.readiness.accepting() && !self.handing_back;
        if !ready && !self.paused {
            self.note_inactive();
            self.handing_back = false;
            let Some(link) = &self.link else { return };
            self.paused = true;
            self.cancelled_streams += 1;
            let (channel, tag) = (link.channel.clone(), link.consumer_tag.clone());
            tracing::info!(queue = %self.config.routes.queue, operator_pause = self.readiness.is_paused(), "consumer cancelled");
            actix::spawn(async move {
                let _ = channel
                    .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                    .await;
            });
        } else if ready && self.paused {
            let Some(link) = &self.link else { return };
            self.resuming = true;
            let channel = link.channel.clone();
            let queue = self.config.routes.queue.clone();
            let tag = format!("seckill-engine-{}", Uuid::now_v7());
            let consume_tag = tag.clone();
            ctx.wait(
                async move {
                    channel
                        .basic_consume(
                            queue.as_ref().into(),
                            consume_tag.as_str().into(),
                            BasicConsumeOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                }
                .into_actor(self)
                .map(move |result, intake, ctx| {
                    intake.resuming = false;
                    match result {
                        Ok(consumer) => {
                            intake.paused = false;
                            if let Some(link) = &mut intake.link {
                                link.consumer_tag = tag;
                            }
                            ctx.add_stream(consumer);
                            tracing::info!(queue = %intake.config.routes.queue, "consuming again");
                        }
                        Err(e) => {
                            tracing::warn!(queue = %intake.config.routes.queue, error = %e, "could not consume again");
                            intake.fail(ctx);
                        }
                    }
                }),
            );
        }
    }

    /// Stops and asks the supervisor for a fresh intake (a new connection).
    fn fail(&mut self, ctx: &mut Context<Self>) {
        if !self.stopping {
            if let Some(supervisor) = &self.supervisor {
                // Not a bounded hand-off: a failure report must not be dropped.
                supervisor.do_send(ChildFailed {
                    name: self.config.name.clone(),
                    kind: "intake",
                });
            }
        }
        ctx.stop();
    }
}

/// Connects, declares the topology (idempotent, so a restarted intake also repairs a
/// deleted queue) and starts consuming.
async fn connect(
    config: IntakeConfig,
    ack_counts: Arc<AckCounts>,
) -> Result<(Link, lapin::Consumer), MqError> {
    let connection = mq::connect(&config.amqp, &format!("seckill-{}", config.name)).await?;
    let channel = connection.create_channel().await?;
    declare_topology(&channel, &config.amqp).await?;
    channel
        .basic_qos(config.prefetch, BasicQosOptions::default())
        .await?;
    // Held acks hold prefetch slots: past half the window they go out one by one.
    let acks = Acks::start(
        channel.clone(),
        config.routes.queue.clone(),
        usize::from(config.prefetch / 2),
        ack_counts,
    );
    let consumer_tag = format!("seckill-engine-{}", Uuid::now_v7());
    let consumer = channel
        .basic_consume(
            config.routes.queue.as_ref().into(),
            consumer_tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let publisher = ConfirmedPublisher::open(&connection).await?;
    Ok((
        Link {
            connection: Arc::new(connection),
            channel,
            consumer_tag,
            outlet: Rc::new(Outlet {
                routes: config.routes,
                publisher,
                acks,
            }),
        },
        consumer,
    ))
}

impl<W: IntakeWork> Actor for Intake<W> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.wait(
            connect(self.config.clone(), self.stats.ack_counts())
                .into_actor(self)
                .map(|result, intake, ctx| match result {
                    Ok((link, consumer)) => {
                        intake.link = Some(link);
                        intake.stats.consuming_started();
                        ctx.add_stream(consumer);
                        ctx.run_interval(READINESS_POLL, |intake, ctx| {
                            intake.follow_readiness(ctx)
                        });
                        tracing::debug!(queue = %intake.config.routes.queue, "consuming");
                    }
                    Err(e) => {
                        tracing::warn!(queue = %intake.config.routes.queue, error = %e, "intake could not start consuming");
                        intake.fail(ctx);
                    }
                }),
        );
    }
}

impl<W: IntakeWork> Drop for Intake<W> {
    fn drop(&mut self) {
        self.note_inactive();
        if self.link.is_some() {
            self.stats.consuming_stopped();
        }
    }
}

impl<W: IntakeWork> Handler<StopChild> for Intake<W> {
    type Result = ();

    /// Cancels the consumer (no new deliveries), lets the deliveries already taken
    /// settle on their own tasks for up to the grace period, then closes the
    /// connection: whatever is still unacked then is redelivered.
    fn handle(&mut self, _: StopChild, ctx: &mut Self::Context) {
        self.stopping = true;
        if let Some(link) = &self.link {
            let (channel, tag) = (link.channel.clone(), link.consumer_tag.clone());
            let connection = link.connection.clone();
            let confirms = link.outlet.publisher.channel().clone();
            let acks = link.outlet.acks.clone();
            let (stats, grace) = (self.stats.clone(), self.config.grace);
            // Counted before this actor drops and stops counting as consuming, so
            // that `closed` never sees neither.
            stats.closing_started();
            actix::spawn(async move {
                let _ = channel
                    .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                    .await;
                stats.drained(grace).await;
                acks.flush().await;
                mq::close(&connection, &[&channel, &confirms]).await;
                stats.closing_done();
            });
        }
        ctx.stop();
    }
}

impl<W: IntakeWork> StreamHandler<Result<Delivery, lapin::Error>> for Intake<W> {
    fn handle(&mut self, item: Result<Delivery, lapin::Error>, ctx: &mut Self::Context) {
        let delivery = match item {
            Ok(delivery) => delivery,
            Err(e) => {
                // lapin ends the stream right after an error; the broker redelivers
                // everything that was not acked.
                tracing::warn!(queue = %self.config.routes.queue, error = %e, "consumer failed");
                return;
            }
        };
        let Some(link) = &self.link else {
            // Unreachable: the stream is added only once connected. Dropping the
            // delivery leaves it unacked, so the broker redelivers it.
            return;
        };
        let outlet = link.outlet.clone();
        self.note_active();
        metrics::counter!(crate::telemetry::names::INTAKE_MESSAGES_TOTAL, "kind" => W::KIND)
            .increment(1);
        observe_age(W::KIND, &delivery.properties);
        let in_flight = self.stats.enter();
        let msg = match self.work.decode(&delivery.data, &delivery.properties) {
            Ok(msg) => msg,
            Err(reason) => {
                metrics::counter!(crate::telemetry::names::INTAKE_DECODE_ERRORS_TOTAL, "kind" => reason.kind)
                    .increment(1);
                actix::spawn(async move {
                    dead_letter(&outlet, delivery, &reason, in_flight).await;
                });
                return;
            }
        };
        // ctx.wait stops this actor from taking the next delivery until a permit is
        // free: the prefetch window fills up and the broker stops sending. The work
        // itself runs as a task of its own: actix does not poll futures spawned into
        // a context while that context waits, and those futures hold the permits.
        let permits = self.permits.clone();
        ctx.wait(
            async move { permits.send(Acquire).await }
                .into_actor(self)
                .map(move |permit, intake, _| {
                    // Without a permit (the permit actor is gone: shutting down) the
                    // message still goes the safe way: delayed retry.
                    let work = match permit {
                        Ok(permit) => Some((intake.work.process(msg), permit)),
                        Err(_) => None,
                    };
                    actix::spawn(settle(outlet, delivery, work, in_flight));
                }),
        );
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        self.note_inactive();
        if self.stopping {
            ctx.stop();
            return;
        }
        if self.cancelled_streams > 0 {
            // The end of a consumer we cancelled for a pause: nothing failed.
            self.cancelled_streams -= 1;
            return;
        }
        // The broker cancelled the consumer or the connection broke: start over.
        tracing::warn!(queue = %self.config.routes.queue, "consumer stream ended; restarting the intake");
        self.fail(ctx);
    }
}

/// Runs the work under its permit and settles the delivery from the result.
async fn settle(
    outlet: Rc<Outlet>,
    delivery: Delivery,
    work: Option<(
        LocalBoxFuture<'static, Result<&'static str, ErrorClass>>,
        Permit,
    )>,
    in_flight: InFlight,
) {
    let result = match work {
        Some((work, permit)) => {
            let result = work.await;
            // The transaction has ended: give the permit back before talking to
            // the broker.
            drop(permit);
            result
        }
        None => Err(ErrorClass::Unavailable("no_permit")),
    };
    if let Err(ErrorClass::CommitOutcomeUnknown) = &result {
        metrics::counter!(crate::telemetry::names::COMMIT_UNKNOWN_TOTAL).increment(1);
        // Rare and worth an operator's (and the fault suite's) attention.
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string());
        tracing::info!(queue = %outlet.routes.queue, message_id, "commit outcome unknown; the redelivery will resolve it");
    }
    match disposition(result.as_ref()) {
        Disposition::Ack => {
            crate::failpoint!("after_commit_before_ack");
            ack(&outlet, &delivery, in_flight)
        }
        Disposition::Retry { reason } => {
            retry(&outlet, delivery, reason, Budget::Spend, in_flight).await
        }
        Disposition::Wait { reason } => {
            retry(&outlet, delivery, reason, Budget::Keep, in_flight).await
        }
        Disposition::DeadLetter { reason } => {
            let reason = PoisonReason::new("processing_failed", reason);
            dead_letter(&outlet, delivery, &reason, in_flight).await;
        }
    }
}

/// Records how long the message waited between its publisher and us, when the
/// publisher said when it published.
fn observe_age(kind: &'static str, props: &BasicProperties) {
    if let Some(published) = mq::int_header(props, mq::PUBLISHED_AT_HEADER) {
        let age_ms = (mq::unix_millis() - published).max(0);
        // Spelled out: tests/it/deploy.rs reads recorded names from the macro calls.
        metrics::histogram!(crate::telemetry::names::INTAKE_MESSAGE_AGE_SECONDS, "kind" => kind)
            .record(age_ms as f64 / 1000.0);
    }
}
