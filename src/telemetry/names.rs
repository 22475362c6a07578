//! The metric catalogue: every metric the engine exports, by one constant each, with
//! its kind and help text. Names carry their base unit (`_seconds`, `_total` for
//! counters); labels are bounded sets (never a user or message id). The recorder
//! registers the help texts (`describe`), and docs/OPERATIONS.md lists the same
//! names (a test compares them).

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One entry of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

/// Units a live sale's bucket has allocated to orders, by `activity`, `sku`, `bucket` (only while the sale is live).
pub const BUCKET_ALLOCATED_UNITS: &str = "seckill_bucket_allocated_units";
/// Units a live sale's bucket still holds in PostgreSQL, by `activity`, `sku`, `bucket` (only while the sale is live).
pub const BUCKET_AVAILABLE_UNITS: &str = "seckill_bucket_available_units";
/// 1 when a live sale's bucket holds no unit, else 0, by `activity`, `sku`, `bucket` (only while the sale is live).
pub const BUCKET_SOLD_OUT: &str = "seckill_bucket_sold_out";
/// Rows violating the stock invariants (the checks of `seckill-engine check`) over the live sales, from the last scheduled run.
pub const CONSERVATION_VIOLATIONS: &str = "seckill_conservation_violations";
/// Deadlocks PostgreSQL detected in the engine's database (pg_stat_database).
pub const DB_DEADLOCKS_TOTAL: &str = "seckill_db_deadlocks_total";
/// Order transactions aborted by `database.lock_timeout_ms` (SQLSTATE 55P03).
pub const DB_LOCK_TIMEOUTS_TOTAL: &str = "seckill_db_lock_timeouts_total";
/// How long the longest lock wait in the engine's database has lasted so far (0 when none waits).
pub const DB_LOCK_WAIT_MAX_SECONDS: &str = "seckill_db_lock_wait_max_seconds";
/// Sessions of the engine's database waiting for a lock right now.
pub const DB_LOCK_WAITING_SESSIONS: &str = "seckill_db_lock_waiting_sessions";
/// The server's WAL position in bytes (its rate is the WAL written per second).
/// Rebuilds of a sale's Redis keys from PostgreSQL, by `trigger` (`lost_keys`: the
/// front stage found them gone; `master_moved`: a Sentinel fail-over promoted another
/// server; `command`: `seckill-engine redis rebuild`).
pub const REDIS_REBUILDS_TOTAL: &str = "seckill_redis_rebuilds_total";
pub const DB_WAL_BYTES: &str = "seckill_db_wal_bytes";
/// 1 while WAL archiving is on (`archive_mode`), else 0.
pub const DB_WAL_ARCHIVE_ENABLED: &str = "seckill_db_wal_archive_enabled";
/// WAL segments archived (pg_stat_archiver).
pub const DB_WAL_ARCHIVED_TOTAL: &str = "seckill_db_wal_archived_total";
/// Failed `archive_command` runs (pg_stat_archiver).
pub const DB_WAL_ARCHIVE_FAILED_TOTAL: &str = "seckill_db_wal_archive_failed_total";
/// 1 while the archiver's last attempt failed (a failure after the last success).
pub const DB_WAL_ARCHIVE_FAILING: &str = "seckill_db_wal_archive_failing";
/// Seconds since the last segment was archived.
pub const DB_WAL_ARCHIVE_LAST_SUCCESS_AGE_SECONDS: &str =
    "seckill_db_wal_archive_last_success_age_seconds";
/// WAL segments ready and not yet archived (kept on the primary's disk).
pub const DB_WAL_SEGMENTS_WAITING: &str = "seckill_db_wal_segments_waiting";
/// Checkpoints started by `checkpoint_timeout`.
pub const DB_CHECKPOINTS_TIMED_TOTAL: &str = "seckill_db_checkpoints_timed_total";
/// Checkpoints requested (by WAL volume past `max_wal_size`, or by hand).
pub const DB_CHECKPOINTS_REQUESTED_TOTAL: &str = "seckill_db_checkpoints_requested_total";
/// PostgreSQL's available units minus Redis stock minus Redis reservations PostgreSQL has not seen, by `activity`, `sku`, from the reconciler's pass (only while the sale is live).
pub const REDIS_DRIFT_UNITS: &str = "seckill_redis_drift_units";
/// WAL a standby has been sent but not replayed, by `standby` (pg_stat_replication).
pub const STANDBY_REPLAY_LAG_BYTES: &str = "seckill_standby_replay_lag_bytes";
/// A standby's replay lag, by `standby` (pg_stat_replication).
pub const STANDBY_REPLAY_LAG_SECONDS: &str = "seckill_standby_replay_lag_seconds";
/// Dead row versions of a table of the engine's schema, by `table`.
pub const TABLE_DEAD_TUPLES: &str = "seckill_table_dead_tuples";
/// Time since a table was last vacuumed (by hand or autovacuum), by `table`; absent for a table never vacuumed.
pub const TABLE_LAST_VACUUM_AGE_SECONDS: &str = "seckill_table_last_vacuum_age_seconds";
/// Children the supervisor restarted after a failure, by `actor`.
pub const ACTOR_RESTARTS_TOTAL: &str = "seckill_actor_restarts_total";
/// Operator API actions taken, by `action`.
pub const ADMIN_ACTIONS_TOTAL: &str = "seckill_admin_actions_total";
/// Always 1; the `version` label names the running build.
pub const BUILD_INFO: &str = "seckill_build_info";
/// Messages (orders and payment callbacks) whose COMMIT outcome was unknown (sent back for a redelivery the inbox answers).
pub const COMMIT_UNKNOWN_TOTAL: &str = "seckill_commit_unknown_total";
/// Compensation task attempts, by `result` (`done`, `failed`).
pub const COMPENSATION_ATTEMPTS_TOTAL: &str = "seckill_compensation_attempts_total";
/// Compensation tasks that ran out of attempts.
pub const COMPENSATION_DEAD_TOTAL: &str = "seckill_compensation_dead_total";
/// Compensation tasks waiting for an operator.
pub const COMPENSATION_MANUAL_REVIEW: &str = "seckill_compensation_manual_review";
/// Age of the oldest pending compensation task.
pub const COMPENSATION_OLDEST_PENDING_AGE_SECONDS: &str =
    "seckill_compensation_oldest_pending_age_seconds";
/// Pending compensation tasks (counted up to 10,000).
pub const COMPENSATION_PENDING: &str = "seckill_compensation_pending";
/// Time an intake waited for a database permit.
pub const DB_PERMIT_WAIT_SECONDS: &str = "seckill_db_permit_wait_seconds";
/// Database permits free right now.
pub const DB_PERMITS_AVAILABLE: &str = "seckill_db_permits_available";
/// Database permits in all (the bound on work in flight).
pub const DB_PERMITS_CAPACITY: &str = "seckill_db_permits_capacity";
/// Time an order transaction waited for a pooled connection.
pub const DB_POOL_ACQUIRE_SECONDS: &str = "seckill_db_pool_acquire_seconds";
/// Pooled PostgreSQL connections, by `state` (`idle`, `in_use`).
pub const DB_POOL_CONNECTIONS: &str = "seckill_db_pool_connections";
/// Pool checkouts that timed out.
pub const DB_POOL_TIMEOUTS_TOTAL: &str = "seckill_db_pool_timeouts_total";
/// Callers waiting for a pooled connection.
pub const DB_POOL_WAITING: &str = "seckill_db_pool_waiting";
/// Deliveries sent to the dead-letter queue, by `kind` of reason.
pub const DEAD_LETTERED_TOTAL: &str = "seckill_dead_lettered_total";
/// Messages in a dead-letter queue, by `queue`.
pub const DLQ_MESSAGES: &str = "seckill_dlq_messages";
/// Redeliveries whose body differs from the one the inbox recorded for that message id.
pub const INBOX_PAYLOAD_MISMATCH_TOTAL: &str = "seckill_inbox_payload_mismatch_total";
/// Ack frames sent to RabbitMQ (contiguous acks are merged into one).
pub const INTAKE_ACK_FRAMES_TOTAL: &str = "seckill_intake_ack_frames_total";
/// Deliveries settled whose ack could not be sent (the channel had closed).
pub const INTAKE_ACK_FAILURES_TOTAL: &str = "seckill_intake_ack_failures_total";
/// Deliveries that could not be decoded or validated, by `kind`.
pub const INTAKE_DECODE_ERRORS_TOTAL: &str = "seckill_intake_decode_errors_total";
/// Deliveries taken from the queues and not yet settled.
pub const INTAKE_IN_FLIGHT: &str = "seckill_intake_in_flight";
/// Age of a delivery when the intake took it (publish to intake), by `kind` of queue.
pub const INTAKE_MESSAGE_AGE_SECONDS: &str = "seckill_intake_message_age_seconds";
/// Deliveries taken from the queues, by `kind` of queue.
pub const INTAKE_MESSAGES_TOTAL: &str = "seckill_intake_messages_total";
/// 1 while an operator has paused intake (admin API), else 0.
pub const INTAKE_PAUSED: &str = "seckill_intake_paused";
/// Order transactions that hit a unique key on an id the engine minted (another instance minting with the same node id): retried with fresh ids, never dead-lettered.
pub const MINTED_ID_CONFLICTS_TOTAL: &str = "seckill_minted_id_conflicts_total";
/// Times this instance became the active consumer of an order shard, by `shard`.
pub const SHARD_ACQUIRED_TOTAL: &str = "seckill_shard_acquired_total";
/// Times this instance stopped being the active consumer of an order shard (hand-back, pause or lost connection), by `shard`.
pub const SHARD_LOST_TOTAL: &str = "seckill_shard_lost_total";
/// Live per-key actors, by `kind` (`bucket`, `reservation`).
pub const LIVE_ACTORS: &str = "seckill_live_actors";
/// Messages waiting in actors' mailboxes, by `kind`.
pub const MAILBOX_DEPTH: &str = "seckill_mailbox_depth";
/// The deepest mailbox of a kind of actor, by `kind`.
pub const MAILBOX_DEPTH_MAX: &str = "seckill_mailbox_depth_max";
/// Failed runs of a background service, by `service`.
pub const MAINTENANCE_FAILURES_TOTAL: &str = "seckill_maintenance_failures_total";
/// Items a background service handled, by `service` and `item`.
pub const MAINTENANCE_ITEMS_TOTAL: &str = "seckill_maintenance_items_total";
/// Runs of a background service, by `service`.
pub const MAINTENANCE_RUNS_TOTAL: &str = "seckill_maintenance_runs_total";
/// Orders in one order transaction (group commit).
pub const ORDER_BATCH_SIZE: &str = "seckill_order_batch_size";
/// Time from the reservation to the order's COMMIT.
pub const ORDER_COMMIT_LATENCY_SECONDS: &str = "seckill_order_commit_latency_seconds";
/// Order deliveries sent to the delayed-retry queue, by `reason`.
pub const ORDER_RETRIES_TOTAL: &str = "seckill_order_retries_total";
/// Duration of an order transaction, by `outcome`.
pub const ORDER_TX_DURATION_SECONDS: &str = "seckill_order_tx_duration_seconds";
/// Order transactions redone in place, by `reason` (`speculation`, `in_place`).
pub const ORDER_TX_RETRIES_TOTAL: &str = "seckill_order_tx_retries_total";
/// Time an order transaction waited for one of the `engine.order_transactions` slots.
pub const ORDER_TX_SLOT_WAIT_SECONDS: &str = "seckill_order_tx_slot_wait_seconds";
/// Unpaid orders cancelled by the sweeper after their TTL.
pub const ORDERS_CANCELLED_TOTAL: &str = "seckill_orders_cancelled_total";
/// Order messages settled, by `outcome`.
pub const ORDERS_TOTAL: &str = "seckill_orders_total";
/// Outbox events that ran out of publish attempts.
pub const OUTBOX_DEAD: &str = "seckill_outbox_dead";
/// Outbox publish attempts that failed.
pub const OUTBOX_FAILURES_TOTAL: &str = "seckill_outbox_failures_total";
/// Age of the oldest unpublished outbox event.
pub const OUTBOX_OLDEST_PENDING_AGE_SECONDS: &str = "seckill_outbox_oldest_pending_age_seconds";
/// Unpublished outbox events (counted up to 10,000).
pub const OUTBOX_PENDING: &str = "seckill_outbox_pending";
/// Duration of one outbox event's publish, its confirm included.
pub const OUTBOX_PUBLISH_DURATION_SECONDS: &str = "seckill_outbox_publish_duration_seconds";
/// Outbox events published and confirmed.
pub const OUTBOX_PUBLISHED_TOTAL: &str = "seckill_outbox_published_total";
/// Payment callbacks settled, by `result`.
pub const PAYMENTS_TOTAL: &str = "seckill_payments_total";
/// 1 while the engine is ready to take work, else 0.
pub const READY: &str = "seckill_ready";
/// Reads of the buyer's order history, by `source` (`replica` or `primary`).
/// Front-stage requests refused by a rate limit, by `scope` (`user` or `address`).
pub const HTTP_RATE_LIMITED_TOTAL: &str = "seckill_http_rate_limited_total";
/// Purchase tokens the front stage issued, and refused by `reason`.
pub const PURCHASE_TOKENS_TOTAL: &str = "seckill_purchase_tokens_total";
pub const READS_TOTAL: &str = "seckill_reads_total";
/// Reservations answered SOLD_OUT from the front stage's memory, without the reserve script.
pub const SOLD_OUT_FROM_MEMORY_TOTAL: &str = "seckill_sold_out_from_memory_total";
/// Redis units the reconciler gave back for reservations that never reached the engine.
pub const RECONCILER_GIVEN_BACK_TOTAL: &str = "seckill_reconciler_given_back_total";
/// How far database.replica_url lags: 0 once it has replayed the primary's position, else the age of its last replayed transaction.
pub const REPLICA_LAG_SECONDS: &str = "seckill_replica_lag_seconds";
/// Duration of a Redis command or script, by `command`.
pub const REDIS_COMMAND_DURATION_SECONDS: &str = "seckill_redis_command_duration_seconds";
/// Redis commands that failed, by `command`.
pub const REDIS_ERRORS_TOTAL: &str = "seckill_redis_errors_total";
/// Give-backs of a Redis unit run by the compensation worker, by `changed` (`yes` when the unit was returned, `no` when it already had been).
pub const REDIS_GIVE_BACK_TOTAL: &str = "seckill_redis_give_back_total";
/// Redis give-backs requested by the order transaction, by `reason`.
pub const REDIS_RELEASE_REQUESTED_TOTAL: &str = "seckill_redis_release_requested_total";

/// Every metric above, for `describe` and the docs check.
/// The gauges whose series come and go with the data (`telemetry::sampled`), not
/// kept by the recorder.
pub const SAMPLED: &[&str] = &[
    BUCKET_ALLOCATED_UNITS,
    BUCKET_AVAILABLE_UNITS,
    BUCKET_SOLD_OUT,
    REDIS_DRIFT_UNITS,
    STANDBY_REPLAY_LAG_BYTES,
    STANDBY_REPLAY_LAG_SECONDS,
    TABLE_DEAD_TUPLES,
    TABLE_LAST_VACUUM_AGE_SECONDS,
];

pub const CATALOGUE: &[Metric] = &[
    Metric { name: ACTOR_RESTARTS_TOTAL, kind: Kind::Counter, help: "Children the supervisor restarted after a failure, by `actor`." },
    Metric { name: ADMIN_ACTIONS_TOTAL, kind: Kind::Counter, help: "Operator API actions taken, by `action`." },
    Metric { name: BUILD_INFO, kind: Kind::Gauge, help: "Always 1; the `version` label names the running build." },
    Metric { name: COMMIT_UNKNOWN_TOTAL, kind: Kind::Counter, help: "Messages (orders and payment callbacks) whose COMMIT outcome was unknown (sent back for a redelivery the inbox answers)." },
    Metric { name: COMPENSATION_ATTEMPTS_TOTAL, kind: Kind::Counter, help: "Compensation task attempts, by `result` (`done`, `failed`)." },
    Metric { name: COMPENSATION_DEAD_TOTAL, kind: Kind::Counter, help: "Compensation tasks that ran out of attempts." },
    Metric { name: COMPENSATION_MANUAL_REVIEW, kind: Kind::Gauge, help: "Compensation tasks waiting for an operator." },
    Metric { name: COMPENSATION_OLDEST_PENDING_AGE_SECONDS, kind: Kind::Gauge, help: "Age of the oldest pending compensation task." },
    Metric { name: COMPENSATION_PENDING, kind: Kind::Gauge, help: "Pending compensation tasks (counted up to 10,000)." },
    Metric { name: DB_PERMIT_WAIT_SECONDS, kind: Kind::Histogram, help: "Time an intake waited for a database permit." },
    Metric { name: DB_PERMITS_AVAILABLE, kind: Kind::Gauge, help: "Database permits free right now." },
    Metric { name: DB_PERMITS_CAPACITY, kind: Kind::Gauge, help: "Database permits in all (the bound on work in flight)." },
    Metric { name: DB_POOL_ACQUIRE_SECONDS, kind: Kind::Histogram, help: "Time an order transaction waited for a pooled connection." },
    Metric { name: DB_POOL_CONNECTIONS, kind: Kind::Gauge, help: "Pooled PostgreSQL connections, by `state` (`idle`, `in_use`)." },
    Metric { name: DB_POOL_TIMEOUTS_TOTAL, kind: Kind::Counter, help: "Pool checkouts that timed out." },
    Metric { name: DB_POOL_WAITING, kind: Kind::Gauge, help: "Callers waiting for a pooled connection." },
    Metric { name: DEAD_LETTERED_TOTAL, kind: Kind::Counter, help: "Deliveries sent to the dead-letter queue, by `kind` of reason." },
    Metric { name: DLQ_MESSAGES, kind: Kind::Gauge, help: "Messages in a dead-letter queue, by `queue`." },
    Metric { name: INBOX_PAYLOAD_MISMATCH_TOTAL, kind: Kind::Counter, help: "Redeliveries whose body differs from the one the inbox recorded for that message id." },
    Metric { name: INTAKE_ACK_FAILURES_TOTAL, kind: Kind::Counter, help: "Deliveries whose effect was committed but whose ack could not be sent (the channel or connection had closed): the broker redelivers them and the inbox answers." },
    Metric { name: INTAKE_ACK_FRAMES_TOTAL, kind: Kind::Counter, help: "Ack frames sent to RabbitMQ (contiguous acks are merged into one)." },
    Metric { name: INTAKE_DECODE_ERRORS_TOTAL, kind: Kind::Counter, help: "Deliveries that could not be decoded or validated, by `kind`." },
    Metric { name: INTAKE_IN_FLIGHT, kind: Kind::Gauge, help: "Deliveries taken from the queues and not yet settled." },
    Metric { name: INTAKE_MESSAGE_AGE_SECONDS, kind: Kind::Histogram, help: "Age of a delivery when the intake took it (publish to intake), by `kind` of queue." },
    Metric { name: INTAKE_MESSAGES_TOTAL, kind: Kind::Counter, help: "Deliveries taken from the queues, by `kind` of queue." },
    Metric { name: INTAKE_PAUSED, kind: Kind::Gauge, help: "1 while an operator has paused intake (admin API), else 0." },
    Metric { name: MINTED_ID_CONFLICTS_TOTAL, kind: Kind::Counter, help: "Order transactions that hit a unique key on an id the engine minted (another instance minting with the same node id): retried with fresh ids, never dead-lettered." },
    Metric { name: SHARD_ACQUIRED_TOTAL, kind: Kind::Counter, help: "Times this instance became the active consumer of an order shard, by `shard`." },
    Metric { name: SHARD_LOST_TOTAL, kind: Kind::Counter, help: "Times this instance stopped being the active consumer of an order shard (hand-back, pause or lost connection), by `shard`." },
    Metric { name: LIVE_ACTORS, kind: Kind::Gauge, help: "Live per-key actors, by `kind` (`bucket`, `reservation`)." },
    Metric { name: MAILBOX_DEPTH, kind: Kind::Gauge, help: "Messages waiting in actors' mailboxes, by `kind`." },
    Metric { name: MAILBOX_DEPTH_MAX, kind: Kind::Gauge, help: "The deepest mailbox of a kind of actor, by `kind`." },
    Metric { name: MAINTENANCE_FAILURES_TOTAL, kind: Kind::Counter, help: "Failed runs of a background service, by `service`." },
    Metric { name: MAINTENANCE_ITEMS_TOTAL, kind: Kind::Counter, help: "Items a background service handled, by `service` and `item`." },
    Metric { name: MAINTENANCE_RUNS_TOTAL, kind: Kind::Counter, help: "Runs of a background service, by `service`." },
    Metric { name: ORDER_BATCH_SIZE, kind: Kind::Histogram, help: "Orders in one order transaction (group commit)." },
    Metric { name: ORDER_COMMIT_LATENCY_SECONDS, kind: Kind::Histogram, help: "Time from the reservation to the order's COMMIT." },
    Metric { name: ORDER_RETRIES_TOTAL, kind: Kind::Counter, help: "Order deliveries sent to the delayed-retry queue, by `reason`." },
    Metric { name: ORDER_TX_DURATION_SECONDS, kind: Kind::Histogram, help: "Duration of an order transaction, by `outcome`." },
    Metric { name: ORDER_TX_RETRIES_TOTAL, kind: Kind::Counter, help: "Order transactions redone in place, by `reason` (`speculation`, `in_place`)." },
    Metric { name: ORDER_TX_SLOT_WAIT_SECONDS, kind: Kind::Histogram, help: "Time an order transaction waited for one of the `engine.order_transactions` slots." },
    Metric { name: ORDERS_CANCELLED_TOTAL, kind: Kind::Counter, help: "Unpaid orders cancelled by the sweeper after their TTL." },
    Metric { name: ORDERS_TOTAL, kind: Kind::Counter, help: "Order messages settled, by `outcome`." },
    Metric { name: OUTBOX_DEAD, kind: Kind::Gauge, help: "Outbox events that ran out of publish attempts." },
    Metric { name: OUTBOX_FAILURES_TOTAL, kind: Kind::Counter, help: "Outbox publish attempts that failed." },
    Metric { name: OUTBOX_OLDEST_PENDING_AGE_SECONDS, kind: Kind::Gauge, help: "Age of the oldest unpublished outbox event." },
    Metric { name: OUTBOX_PENDING, kind: Kind::Gauge, help: "Unpublished outbox events (counted up to 10,000)." },
    Metric { name: OUTBOX_PUBLISH_DURATION_SECONDS, kind: Kind::Histogram, help: "Duration of one outbox event's publish, its confirm included." },
    Metric { name: OUTBOX_PUBLISHED_TOTAL, kind: Kind::Counter, help: "Outbox events published and confirmed." },
    Metric { name: PAYMENTS_TOTAL, kind: Kind::Counter, help: "Payment callbacks settled, by `result`." },
    Metric { name: READY, kind: Kind::Gauge, help: "1 while the engine is ready to take work, else 0." },
    Metric { name: HTTP_RATE_LIMITED_TOTAL, kind: Kind::Counter, help: "Front-stage requests refused by a rate limit, by `scope` (`user` or `address`)." },
    Metric { name: PURCHASE_TOKENS_TOTAL, kind: Kind::Counter, help: "Purchase tokens the front stage issued (`outcome` issued) or refused a reservation for (`outcome` missing, invalid, expired, mismatch)." },
    Metric { name: SOLD_OUT_FROM_MEMORY_TOTAL, kind: Kind::Counter, help: "Reservations answered SOLD_OUT from the front stage's memory, without the reserve script." },
    Metric { name: READS_TOTAL, kind: Kind::Counter, help: "Reads of the buyer's order history, by `source` (`replica` or `primary`)." },
    Metric { name: REPLICA_LAG_SECONDS, kind: Kind::Gauge, help: "How far database.replica_url lags: 0 once it has replayed the primary's position, else the age of its last replayed transaction." },
    Metric { name: RECONCILER_GIVEN_BACK_TOTAL, kind: Kind::Counter, help: "Redis units the reconciler gave back for reservations that never reached the engine." },
    Metric { name: REDIS_COMMAND_DURATION_SECONDS, kind: Kind::Histogram, help: "Duration of a Redis command or script, by `command`." },
    Metric { name: REDIS_ERRORS_TOTAL, kind: Kind::Counter, help: "Redis commands that failed, by `command`." },
    Metric { name: REDIS_GIVE_BACK_TOTAL, kind: Kind::Counter, help: "Give-backs of a Redis unit run by the compensation worker, by `changed` (`yes` when the unit was returned, `no` when it already had been)." },
    Metric { name: REDIS_RELEASE_REQUESTED_TOTAL, kind: Kind::Counter, help: "Redis give-backs requested by the order transaction, by `reason`." },
    Metric { name: BUCKET_ALLOCATED_UNITS, kind: Kind::Gauge, help: "Units a live sale's bucket has allocated to orders, by `activity`, `sku`, `bucket` (only while the sale is live)." },
    Metric { name: BUCKET_AVAILABLE_UNITS, kind: Kind::Gauge, help: "Units a live sale's bucket still holds in PostgreSQL, by `activity`, `sku`, `bucket` (only while the sale is live)." },
    Metric { name: BUCKET_SOLD_OUT, kind: Kind::Gauge, help: "1 when a live sale's bucket holds no unit, else 0, by `activity`, `sku`, `bucket` (only while the sale is live)." },
    Metric { name: CONSERVATION_VIOLATIONS, kind: Kind::Gauge, help: "Rows violating the stock invariants (the checks of `seckill-engine check`) over the live sales, from the last scheduled run." },
    Metric { name: DB_DEADLOCKS_TOTAL, kind: Kind::Counter, help: "Deadlocks PostgreSQL detected in the engine's database (pg_stat_database)." },
    Metric { name: DB_LOCK_TIMEOUTS_TOTAL, kind: Kind::Counter, help: "Order transactions aborted by `database.lock_timeout_ms` (SQLSTATE 55P03)." },
    Metric { name: DB_LOCK_WAIT_MAX_SECONDS, kind: Kind::Gauge, help: "How long the longest lock wait in the engine's database has lasted so far (0 when none waits)." },
    Metric { name: DB_LOCK_WAITING_SESSIONS, kind: Kind::Gauge, help: "Sessions of the engine's database waiting for a lock right now." },
    Metric { name: REDIS_REBUILDS_TOTAL, kind: Kind::Counter, help: "Rebuilds of a sale's Redis keys from PostgreSQL, by trigger (lost_keys, master_moved, command)." },
    Metric { name: DB_WAL_BYTES, kind: Kind::Gauge, help: "The server's WAL position in bytes (its rate is the WAL written per second)." },
    Metric { name: DB_WAL_ARCHIVE_ENABLED, kind: Kind::Gauge, help: "1 while WAL archiving is on (archive_mode), else 0." },
    Metric { name: DB_WAL_ARCHIVED_TOTAL, kind: Kind::Counter, help: "WAL segments archived (pg_stat_archiver)." },
    Metric { name: DB_WAL_ARCHIVE_FAILED_TOTAL, kind: Kind::Counter, help: "Failed archive_command runs (pg_stat_archiver)." },
    Metric { name: DB_WAL_ARCHIVE_FAILING, kind: Kind::Gauge, help: "1 while the archiver's last attempt failed (a failure after the last success)." },
    Metric { name: DB_WAL_ARCHIVE_LAST_SUCCESS_AGE_SECONDS, kind: Kind::Gauge, help: "Seconds since the last WAL segment was archived." },
    Metric { name: DB_WAL_SEGMENTS_WAITING, kind: Kind::Gauge, help: "WAL segments ready and not yet archived (kept on the primary's disk)." },
    Metric { name: DB_CHECKPOINTS_TIMED_TOTAL, kind: Kind::Counter, help: "Checkpoints started by checkpoint_timeout." },
    Metric { name: DB_CHECKPOINTS_REQUESTED_TOTAL, kind: Kind::Counter, help: "Checkpoints requested (by WAL volume past max_wal_size, or by hand)." },
    Metric { name: REDIS_DRIFT_UNITS, kind: Kind::Gauge, help: "PostgreSQL's available units minus Redis stock minus Redis reservations PostgreSQL has not seen, by `activity`, `sku`, from the reconciler's pass (only while the sale is live)." },
    Metric { name: STANDBY_REPLAY_LAG_BYTES, kind: Kind::Gauge, help: "WAL a standby has been sent but not replayed, by `standby` (pg_stat_replication)." },
    Metric { name: STANDBY_REPLAY_LAG_SECONDS, kind: Kind::Gauge, help: "A standby's replay lag, by `standby` (pg_stat_replication)." },
    Metric { name: TABLE_DEAD_TUPLES, kind: Kind::Gauge, help: "Dead row versions of a table of the engine's schema, by `table`." },
    Metric { name: TABLE_LAST_VACUUM_AGE_SECONDS, kind: Kind::Gauge, help: "Time since a table was last vacuumed (by hand or autovacuum), by `table`; absent for a table never vacuumed." },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_prefixed_and_in_base_units() {
        let mut seen = std::collections::HashSet::new();
        for m in CATALOGUE {
            assert!(seen.insert(m.name), "{} twice", m.name);
            assert!(m.name.starts_with("seckill_"), "{}", m.name);
            assert!(!m.help.is_empty(), "{} has no help", m.name);
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}: counters, and only counters, end in _total",
                m.name
            );
            for unit in ["_ms", "_millis", "_micros", "_bytes_kb"] {
                assert!(!m.name.contains(unit), "{}: base units only", m.name);
            }
        }
    }
}
