//! `validate`: the configuration loads, and PostgreSQL (schema current, a primary
//! that can take orders), RabbitMQ and Redis answer; the front stage's settings are
//! usable. One line per check, naming where its key was set.

use std::path::Path;
use std::process::ExitCode;

use crate::config::{self, Settings};
use crate::store::{self, migrate};

/// Runs every check, even after one failed; exits non-zero if any did.
pub async fn run(settings: &Settings, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let figment = config::figment(config_file);
    let from = |key: &str| format!("{key} from {}", config::origin(&figment, key));
    println!("ok   config");
    let mut failed = false;
    let mut report = |name: &str, key: &str, result: Result<String, String>| match result {
        Ok(detail) => println!("ok   {name:<12} {detail} ({})", from(key)),
        Err(e) => {
            failed = true;
            println!("FAIL {name:<12} {e} ({})", from(key));
        }
    };
    report("postgres", "database.url", postgres(settings).await);
    report("durability", "database.url", durability(settings).await);
    report("owner", "database.owner_url", owner(settings).await);
    report("rabbitmq", "amqp.url", rabbitmq(settings).await);
    report("redis", "redis.url", redis(settings).await);
    // A process without the front role (`server.roles`) needs none of its keys.
    let frontstage = match settings.server.front() {
        true => crate::http::front::check_settings(settings),
        false => Ok(format!(
            "not run here (server.roles = {})",
            settings.server.label()
        )),
    };
    report("frontstage", "frontstage.auth.mode", frontstage);
    // What each link runs over: said, never failed here (the link's own check
    // above fails when TLS is required and not there).
    for t in settings.transports() {
        report(&format!("{} tls", t.link), t.key, Ok(t.summary));
    }

    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Whether `migrate` can run as the configured owner (`database.owner_url`, else
/// `database.url`'s role).
async fn owner(settings: &Settings) -> Result<String, String> {
    let config = store::owner_pg_config(&settings.database).map_err(why)?;
    match migrate::owner_problem(&config).await.map_err(why)? {
        None => Ok(format!(
            "{} can migrate {}",
            config.get_user().unwrap_or("the configured role"),
            config.get_dbname().unwrap_or_default()
        )),
        Some(problem) => Err(problem),
    }
}

/// An error with its causes, on one line.
fn why(e: impl Into<anyhow::Error>) -> String {
    format!("{:#}", e.into())
}

/// Reachable, schema current, and a primary that can take orders.
async fn postgres(settings: &Settings) -> Result<String, String> {
    let config = store::pg_config(&settings.database).map_err(why)?;
    let mut client = store::connect(&config).await.map_err(why)?;
    migrate::verify(&mut client)
        .await
        .map_err(|e| format!("reachable, but {e}"))?;
    let state = store::primary::primary_state(&client)
        .await
        .map_err(|e| format!("reachable, but {e}"))?;
    match state.problem(
        settings.database.require_sync_standby,
        settings.database.commit_stall(),
    ) {
        None => Ok(format!("reachable, schema current; {}", state.describe())),
        Some(problem) => Err(format!("reachable, schema current, but {problem}")),
    }
}

/// The `synchronous_commit` this role and database default to, and that the engine
/// commits with `on` anyway (seed §14.2): a weaker default is named, not refused.
async fn durability(settings: &Settings) -> Result<String, String> {
    let default = store::primary::default_synchronous_commit(&settings.database)
        .await
        .map_err(why)?;
    Ok(store::primary::durability_note(&default).unwrap_or_else(|| {
        "synchronous_commit = on by default here, and the engine sets it for its transactions too"
            .to_owned()
    }))
}

/// The broker accepts a connection.
async fn rabbitmq(settings: &Settings) -> Result<String, String> {
    let conn = crate::mq::connect(&settings.amqp, "seckill-validate")
        .await
        .map_err(why)?;
    let _ = conn.close(200, "validated".into()).await;
    Ok("reachable".to_owned())
}

/// Redis accepts a connection and answers PING (`redis::health`) within 10 s.
async fn redis(settings: &Settings) -> Result<String, String> {
    crate::redis::health::check_new(&settings.redis, std::time::Duration::from_secs(10)).await?;
    Ok("reachable".to_owned())
}
