//! `[engine]`: the order pipeline's sizes: orders in flight, group commit, the
//! transactions at once, the pipeline's threads, and the node id. Every rule on
//! them is a numeric bound (`config::BOUNDS`).

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    pub db_permits: u32,
    /// Unset: leased from PostgreSQL (`store::node_lease`).
    pub node_id: Option<u16>,
    pub node_lease_ttl_ms: u64,
    pub batch_max_size: u32,
    pub bucket_pipeline: u32,
    pub order_transactions: u32,
    /// Pipeline lanes (threads); 0: one per available core (`actors::lanes`).
    pub pipeline_threads: u32,
}

/// The largest `engine.pipeline_threads`: a lane costs a thread and its share of the
/// pool, and more lanes than cores only add switching.
pub const MAX_PIPELINE_THREADS: usize = 64;

#[cfg(test)]
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.
    use crate::config::Settings;
    use figment::Jail;

    #[test]
    fn zero_order_transactions_is_rejected_naming_the_key() {
        Jail::expect_with(|jail| {
            jail.set_env("SECKILL__ENGINE__ORDER_TRANSACTIONS", "0");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("engine.order_transactions"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn a_value_out_of_bounds_names_its_key_and_source() {
        for (var, value, key) in [
            (
                "SECKILL__ENGINE__BATCH_MAX_SIZE",
                "1025",
                "engine.batch_max_size",
            ),
            (
                "SECKILL__ENGINE__PIPELINE_THREADS",
                "65",
                "engine.pipeline_threads",
            ),
            ("SECKILL__ENGINE__NODE_ID", "1024", "engine.node_id"),
        ] {
            crate::config::check::tests::refusal(var, value, key);
        }
    }
}
