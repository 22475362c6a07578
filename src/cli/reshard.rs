//! `reshard`: changes the number of order shard queues recorded in PostgreSQL
//! (`store::topology`), refused while any order queue or retry queue of the old or
//! the new layout holds a message or has a consumer.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::Settings;
use crate::domain::shard::SHARD_FUNCTION_VERSION;
use crate::mq::topology::Names;
use crate::store::topology::{self, ShardLayout};
use crate::store::{self, migrate};

/// Records `shards` as the layout once no order queue of either layout is in use.
pub async fn run(settings: &Settings, shards: u16) -> anyhow::Result<ExitCode> {
    if !(1..=1024).contains(&shards) {
        eprintln!("error: --shards must be between 1 and 1024, got {shards}");
        return Ok(ExitCode::from(2));
    }
    let config = store::pg_config(&settings.database)?;
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut client).await?;
    let recorded = topology::read(&client).await?;
    let old = recorded.map_or(settings.amqp.shards, |l| l.shards);
    let busy = busy_queues(settings, old.max(shards)).await?;
    if !busy.is_empty() {
        eprintln!(
            "error: refusing to change the shard layout from {old} to {shards} shards while order queues are in use (stop every engine and front stage and let them drain):"
        );
        for b in busy {
            eprintln!("  {b}");
        }
        return Ok(ExitCode::FAILURE);
    }
    let layout = ShardLayout {
        shard_function: SHARD_FUNCTION_VERSION,
        shards,
    };
    topology::replace(&client, layout).await?;
    println!(
        "shard layout: {} → {layout}; set amqp.shards = {shards} for every engine and front stage",
        recorded.map_or_else(|| "none recorded".to_owned(), |l| l.to_string())
    );
    Ok(ExitCode::SUCCESS)
}

/// The order and retry queues of shards `0..shards` that hold a message or have a
/// consumer, one line each (a queue that does not exist is not in use).
async fn busy_queues(settings: &Settings, shards: u16) -> anyhow::Result<Vec<String>> {
    let names = Names::new(&settings.amqp.namespace);
    let conn = crate::mq::connect(&settings.amqp, "seckill-reshard")
        .await
        .context("connecting to RabbitMQ")?;
    let mut busy = Vec::new();
    for shard in 0..shards {
        for queue in [names.order_queue(shard), names.order_retry_queue(shard)] {
            // A passive declare of a missing queue closes its channel: one each.
            let channel = conn.create_channel().await?;
            match crate::mq::queue_counts(&channel, &queue).await {
                Ok(c) if c.messages > 0 || c.consumers > 0 => busy.push(format!(
                    "{queue}: {} messages, {} consumers",
                    c.messages, c.consumers
                )),
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e).with_context(|| format!("reading {queue}")),
            }
            let _ = channel.close(200, "counted".into()).await;
        }
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(busy)
}
