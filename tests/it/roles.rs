//! One role per job (docs/OPERATIONS.md, "Roles"): the roles of
//! `scripts/lib/roles.sql` on the suite's PostgreSQL server, a test database owned
//! and migrated by `seckill_owner`, and the engine (in-process and `serve`) running
//! as `seckill_engine`, which can read and write its tables and change nothing else.

use figment::providers::{Format, Serialized};
use secrecy::ExposeSecret;
use tokio_postgres::error::SqlState;

use crate::common::process::{engine, env_of, Serve};
use crate::common::{admin_config, base_settings, TestEnv};

/// The suite's server URL as `user`.
fn url_as(user: &str) -> String {
    let admin = admin_config();
    let host = match admin.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = admin.get_ports().first().copied().unwrap_or(5432);
    format!("postgres://{user}@{host}:{port}/seckill?sslmode=disable")
}

/// A deployment's roles on the suite's server: `scripts/lib/roles.sql` under a
/// prefix of its own (dropped with it), as `up --roles` runs it.
pub(crate) struct Roles {
    pub(crate) prefix: String,
}

impl Roles {
    pub(crate) async fn create() -> Roles {
        let prefix = format!("rt{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let admin = seckill_engine::store::connect(&admin_config())
            .await
            .unwrap();
        admin
            .execute(
                "SELECT set_config('seckill.role_prefix', $1, false)",
                &[&prefix],
            )
            .await
            .unwrap();
        admin
            .batch_execute(include_str!("../../scripts/lib/roles.sql"))
            .await
            .expect("scripts/lib/roles.sql");
        Roles { prefix }
    }

    pub(crate) fn role(&self, job: &str) -> String {
        format!("{}_{job}", self.prefix)
    }

    /// A test world whose database the owner role owns and migrated (granting to
    /// this prefix), and whose engine connects as the engine role.
    pub(crate) async fn env(&self) -> TestEnv {
        let superuser = base_settings().database.url.expose_secret().to_owned();
        TestEnv::on_servers(
            |f| f.merge(Serialized::default("database.url", superuser)),
            |f| {
                f.merge(Serialized::default(
                    "database.url",
                    url_as(&self.role("engine")),
                ))
                .merge(Serialized::default(
                    "database.owner_url",
                    url_as(&self.role("owner")),
                ))
                .merge(Serialized::default("database.role_prefix", &self.prefix))
            },
        )
        .await
    }
}

impl Drop for Roles {
    /// After the test's databases are gone (their cleanup runs first: declared
    /// after the roles, dropped before them).
    fn drop(&mut self) {
        let roles: Vec<String> = ["engine", "owner", "history", "runtime", "readonly"]
            .iter()
            .map(|job| format!("\"{}\"", self.role(job)))
            .collect();
        let _ = std::process::Command::new("psql")
            .args([
                "-X",
                "-q",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
            ])
            .arg(format!("DROP ROLE IF EXISTS {}", roles.join(", ")))
            .output();
    }
}

#[actix_rt::test]
async fn serve_runs_as_the_runtime_role_which_cannot_change_the_schema() {
    let roles = Roles::create().await;
    let env = roles.env().await;
    let db = env.db().await;
    let row = db
        .query_one(
            "SELECT current_user::text, pg_has_role('pg_monitor', 'member')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), roles.role("engine"));
    assert!(row.get::<_, bool>(1), "the runtime role lacks pg_monitor");
    for ddl in [
        "CREATE TABLE seckill.intruder (i int)",
        "CREATE TABLE public.intruder (i int)",
        "CREATE SCHEMA intruder",
        "ALTER TABLE seckill.orders ADD COLUMN intruder int",
        "DROP TABLE seckill.consumer_inbox",
        "TRUNCATE seckill.orders",
    ] {
        let e = db.batch_execute(ddl).await.expect_err(ddl);
        assert_eq!(
            e.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{ddl}: {e}"
        );
    }

    // History reads: a member of the read-only role reads, and writes nothing.
    let mut history = seckill_engine::store::PgTarget::from_url(&crate::common::with_dbname(
        &url_as(&roles.role("history")),
        &env.db_name,
    ))
    .unwrap();
    history.options("-c search_path=seckill,public");
    let history = seckill_engine::store::connect(&history).await.unwrap();
    history
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap();
    let e = history
        .batch_execute("DELETE FROM orders")
        .await
        .expect_err("the read-only role deleted");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");

    // `serve` as the runtime role: ready, and no permission error on the way.
    let (serve, ready) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    let (status, text) = serve.terminate().await;
    assert!(ready, "serve never got ready as the runtime role:\n{text}");
    assert!(status.success(), "{text}");
    assert!(!text.contains("permission denied"), "{text}");

    crate::pipeline::one_unit_among_a_thousand_buyers(env).await;
}

/// `scripts/services up --roles` on the suite's services, for this test's
/// namespace, key prefix and user names; its settings file, then the users'
/// removal and its database's when dropped.
pub(crate) struct Identities {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) users: String,
    pub(crate) db: String,
}

impl Identities {
    async fn create(namespace: &str, prefix: &str) -> Identities {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let dir = std::env::temp_dir().join(format!("seckill-roles-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let identities = Identities {
            dir,
            users: format!("t{id}"),
            db: format!("seckill_roles_{id}"),
        };
        let url = crate::common::with_dbname(
            base_settings().database.url.expose_secret(),
            &identities.db,
        );
        let env = [
            ("SECKILL_SERVICES_DIR", identities.dir.display().to_string()),
            ("SECKILL_ROLES_USER_PREFIX", identities.users.clone()),
            ("SECKILL__AMQP__NAMESPACE", namespace.to_owned()),
            ("SECKILL__REDIS__KEY_PREFIX", prefix.to_owned()),
            ("SECKILL__DATABASE__URL", url),
        ];
        let text =
            crate::common::project_script("scripts/services", &["up", "--roles"], &env).await;
        assert!(!text.contains("warning"), "{text}");
        identities
    }

    fn settings_file(&self) -> std::path::PathBuf {
        self.dir.join("roles.toml")
    }
}

impl Drop for Identities {
    fn drop(&mut self) {
        for kind in ["engine", "frontstage", "payments"] {
            let _ = std::process::Command::new("rabbitmqctl")
                .args(["-q", "delete_user", &format!("{}-{kind}", self.users)])
                .output();
        }
        let _ = std::process::Command::new("redis-cli")
            .args(["ACL", "DELUSER", &format!("{}-engine", self.users)])
            .output();
        let _ = std::process::Command::new("psql")
            .args([
                "-X",
                "-q",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
            ])
            .arg(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db))
            .output();
        // `up --roles` named the PostgreSQL roles after the database.
        let roles: Vec<String> = ["engine", "owner", "history", "runtime", "readonly"]
            .iter()
            .map(|job| format!("{}_{job}", self.db))
            .collect();
        let _ = std::process::Command::new("psql")
            .args([
                "-X",
                "-q",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
            ])
            .arg(format!("DROP ROLE IF EXISTS {}", roles.join(", ")))
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[actix_rt::test]
async fn the_front_stage_and_the_engine_run_as_their_broker_and_redis_users() {
    // The world's namespace and prefix are known only once it exists; the users
    // are made for a namespace chosen here and the world is told to use it.
    let namespace = format!("r{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let identities = Identities::create(&namespace, &namespace).await;
    let superuser = base_settings().database.url.expose_secret().to_owned();
    let file = identities.settings_file();
    let env = TestEnv::on_servers(
        |f| {
            f.merge(Serialized::default("database.url", superuser))
                .merge(Serialized::default("amqp.namespace", &namespace))
                .merge(Serialized::default("redis.key_prefix", &namespace))
        },
        |f| f.merge(figment::providers::Toml::file_exact(&file)),
    )
    .await;
    let s = &env.settings;
    assert!(s
        .amqp
        .url
        .expose_secret()
        .contains(&format!("{}-engine:", identities.users)));
    assert!(s
        .redis
        .url
        .expose_secret()
        .contains(&format!("{}-engine:", identities.users)));

    // The front stage's user publishes order messages and nothing else.
    let mut front = s.amqp.clone();
    front.url = s.frontstage.amqp_url.clone().expect("frontstage.amqp_url");
    let conn = seckill_engine::mq::connect(&front, "seckill-test")
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let e = channel
        .queue_declare(
            format!("{namespace}.intruder").as_str().into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .expect_err("the front stage's user declared a queue");
    assert!(e.to_string().contains("ACCESS_REFUSED"), "{e}");
    let _ = conn.close(200, "done".into()).await;

    // The Redis user runs the engine's commands on its prefix, and nothing else.
    let mut redis = env.redis().await;
    let e = ::redis::cmd("KEYS")
        .arg("*")
        .query_async::<Vec<String>>(&mut redis)
        .await
        .expect_err("KEYS allowed");
    assert!(
        e.to_string().to_lowercase().contains("no permissions"),
        "{e}"
    );
    let e = ::redis::cmd("GET")
        .arg("elsewhere:key")
        .query_async::<Option<String>>(&mut redis)
        .await
        .expect_err("a key outside the prefix");
    assert!(
        e.to_string().to_lowercase().contains("no permissions"),
        "{e}"
    );

    crate::frontstage::front_stage_reports_every_state(env).await;
}

impl Identities {
    /// A broker URL as `{users}-{kind}`, with the password `up --roles` generated.
    fn amqp_url_as(&self, kind: &str, password_key: &str) -> String {
        let secrets = std::fs::read_to_string(self.dir.join("roles/secrets")).unwrap();
        let password = secrets
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{password_key}=")))
            .unwrap_or_else(|| panic!("{password_key} in the secrets file"));
        format!("amqp://{}-{kind}:{password}@127.0.0.1:5672/%2f", self.users)
    }
}

/// Publishes one message as whoever `settings` names, on a fresh channel (a refusal
/// closes the channel), and returns the broker's error if it refused.
async fn publish_as(
    settings: &seckill_engine::config::AmqpSettings,
    route: &seckill_engine::mq::topology::Route,
    body: &[u8],
    properties: lapin::BasicProperties,
) -> Result<(), String> {
    let conn = seckill_engine::mq::connect(settings, "seckill-test")
        .await
        .unwrap();
    let publisher = seckill_engine::mq::publisher::ConfirmedPublisher::open(&conn)
        .await
        .unwrap();
    let r = publisher
        .publish(&route.exchange, &route.routing_key, body, properties)
        .await
        .map_err(|e| e.to_string());
    let _ = conn.close(200, "done".into()).await;
    r
}

/// Issue 49: a queue takes orders only from order producers. No identity of
/// `up --roles` may write on the default exchange (which routes to every queue by
/// name); the payments user reaches the payment queue only; and with the profile's
/// signing secret an unsigned order is dead-lettered while a signed one is made.
#[actix_rt::test]
async fn no_identity_but_an_order_producer_can_put_an_order_on_a_shard_queue() {
    use crate::common::builders;
    use seckill_engine::mq::topology::Route;

    let namespace = format!("r{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let identities = Identities::create(&namespace, &namespace).await;
    let superuser = base_settings().database.url.expose_secret().to_owned();
    let file = identities.settings_file();
    let env = TestEnv::on_servers(
        |f| {
            f.merge(Serialized::default("database.url", superuser))
                .merge(Serialized::default("amqp.namespace", &namespace))
                .merge(Serialized::default("redis.key_prefix", &namespace))
        },
        |f| f.merge(figment::providers::Toml::file_exact(&file)),
    )
    .await;
    let s = env.settings.clone();
    assert!(
        s.amqp.order_signing_secret.is_some(),
        "up --roles sets amqp.order_signing_secret"
    );
    let mut db = env.db().await;
    builders::activity(&mut db, 4901, 1, 10, 1).await;
    let engine = crate::common::engine::EngineHandle::start(&s).await;

    let names = &env.names;
    let order = builders::order(4901, 1, 777_777, 0);
    let body = serde_json::to_vec(&order).unwrap();
    let signed = || {
        seckill_engine::mq::order_properties(
            &order.message_id.to_string(),
            &body,
            s.amqp.order_signing_secret.as_ref(),
        )
    };
    let shard_queue = Route {
        exchange: String::new(),
        routing_key: names.order_queue(0),
    };
    let as_user = |kind: &str, key: &str| {
        let mut amqp = s.amqp.clone();
        amqp.url = identities.amqp_url_as(kind, key).into();
        amqp
    };
    let (payments, front, engine_user) = (
        as_user("payments", "PW_PAY"),
        as_user("frontstage", "PW_FRONT"),
        s.amqp.clone(),
    );
    // Every way in for a signed order body that is not the order producers' own.
    let forged = [
        (&payments, shard_queue.clone()),
        (&payments, names.order_route(0)),
        (&payments, names.retry_route(&names.order_retry_queue(0))),
        (&payments, names.order_dead_route()),
        (&front, shard_queue.clone()),
        (&front, names.payment_route()),
        (&front, names.retry_route(&names.order_retry_queue(0))),
        (&engine_user, shard_queue.clone()),
    ];
    for (who, route) in forged {
        let e = publish_as(who, &route, &body, signed())
            .await
            .expect_err(&format!("the broker took a publish to {route:?}"));
        assert!(e.contains("ACCESS_REFUSED"), "{route:?}: {e}");
    }
    // The payments user does publish payment callbacks.
    let callback = serde_json::to_vec(&builders::payment_for(&order)).unwrap();
    publish_as(
        &payments,
        &names.payment_route(),
        &callback,
        lapin::BasicProperties::default(),
    )
    .await
    .expect("a payment callback as the payments user");

    // As the engine's own user, through the order exchange: unsigned is
    // dead-lettered with its reason, signed makes the order.
    let unsigned = builders::order(4901, 1, 777_778, 0);
    let unsigned_body = serde_json::to_vec(&unsigned).unwrap();
    publish_as(
        &engine_user,
        &names.order_route(0),
        &unsigned_body,
        seckill_engine::mq::message_properties(&unsigned.message_id.to_string()),
    )
    .await
    .expect("the engine's user publishes to the order exchange");
    publish_as(&engine_user, &names.order_route(0), &body, signed())
        .await
        .expect("a signed order");
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    assert!(
        env.wait_ready_count(&channel, &names.order_dead_queue(), 1)
            .await,
        "the unsigned order never reached the dead-letter queue"
    );
    let dead = crate::pipeline::drain_dead_letters(&env, &channel).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, "unsigned", "{dead:?}");
    assert_eq!(dead[0].2, unsigned_body);
    crate::common::wait::wait_for(
        crate::common::wait::settle(),
        "the signed order",
        || async {
            crate::common::count(&db, "SELECT count(*) FROM orders WHERE user_id = 777777").await
                == 1
        },
    )
    .await;
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        1
    );
    let _ = amqp.close(200, "done".into()).await;
    engine.stop().await;
    env.cleanup().await;
}

/// Issue 49: two databases on one cluster get disjoint roles, neither's runtime role
/// can open the other's database, and the runtime role cannot delete or rewrite
/// what is history (ledger, payments, orders, the outbox history) nor prices and
/// stock totals; what the engine does write still works.
#[actix_rt::test]
async fn each_database_has_its_own_roles_and_the_runtime_role_cannot_rewrite_history() {
    let (roles_a, roles_b) = (Roles::create().await, Roles::create().await);
    let (env_a, env_b) = (roles_a.env().await, roles_b.env().await);
    assert_ne!(roles_a.role("runtime"), roles_b.role("runtime"));

    // A's engine role cannot even connect to B's database.
    let b_as_a = seckill_engine::store::PgTarget::from_url(&crate::common::with_dbname(
        &url_as(&roles_a.role("engine")),
        &env_b.db_name,
    ))
    .unwrap();
    let Err(e) = seckill_engine::store::connect(&b_as_a).await else {
        panic!("A's engine role connected to B's database");
    };
    assert!(
        format!("{e:?}").contains("permission denied for database"),
        "{e:?}"
    );

    // A sale with orders, a payment and history, made as the runtime role; the
    // sold-out messages take back their provisional orders through V9's function.
    let mut db = env_a.db().await;
    crate::common::builders::activity(&mut db, 4907, 1, 3, 1).await;
    let msgs: Vec<_> = (1..=10)
        .map(|user| crate::common::builders::order(4907, 1, user, 0))
        .collect();
    let engine = crate::common::engine::EngineHandle::start(&env_a.settings).await;
    let amqp = env_a.amqp().await;
    crate::common::builders::publish(&env_a, &amqp, &msgs).await;
    crate::common::wait::wait_for(
        crate::common::wait::settle(),
        "ten messages settled",
        || async {
            crate::common::count(
                &db,
                "SELECT count(*) FROM consumer_inbox WHERE result_code IS NOT NULL",
            )
            .await
                == 10
        },
    )
    .await;
    let paid: Vec<_> = msgs
        .iter()
        .take(1)
        .map(crate::common::builders::payment_for)
        .collect();
    crate::common::builders::publish_payments(&env_a, &amqp, &paid).await;
    crate::common::wait::wait_for(
        crate::common::wait::settle(),
        "a payment recorded",
        || async { crate::common::count(&db, "SELECT count(*) FROM payment_record").await == 1 },
    )
    .await;
    engine.stop().await;
    let _ = amqp.close(200, "done".into()).await;
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        3
    );
    db.batch_execute("INSERT INTO event_outbox_history SELECT * FROM event_outbox LIMIT 1")
        .await
        .expect("the runtime role moves outbox rows to the history");

    for forbidden in [
        "DELETE FROM inventory_ledger",
        "DELETE FROM payment_record",
        "DELETE FROM orders",
        "DELETE FROM order_items",
        "DELETE FROM event_outbox_history",
        "UPDATE inventory_ledger SET available_delta = 0",
        "UPDATE payment_record SET amount = 1",
        "UPDATE seckill_sku SET unit_price = 1",
        "UPDATE orders SET total_amount = 1",
        "UPDATE orders SET unit_price = 1",
        "UPDATE sku_inventory SET total_stock = total_stock + 100",
        "UPDATE seckill_activity SET end_at = end_at",
    ] {
        let e = db.batch_execute(forbidden).await.expect_err(forbidden);
        assert_eq!(
            e.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{forbidden}: {e}"
        );
    }
    // A committed order is not provisional: the function leaves it.
    let deleted = db
        .query(
            "SELECT * FROM drop_provisional_orders(ARRAY(SELECT order_id FROM orders))",
            &[],
        )
        .await
        .unwrap();
    assert!(deleted.is_empty(), "{deleted:?}");
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        3
    );
    // What the order path writes is still allowed.
    db.batch_execute(
        "UPDATE sku_inventory SET available_stock = available_stock, version = version",
    )
    .await
    .expect("the order path's columns");

    // Every table of the schema is granted to the runtime role (a new table must be
    // listed in store::grants).
    let ungranted: Vec<String> = db
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'seckill' AND c.relkind IN ('r', 'p')
                AND NOT has_table_privilege($1, c.oid, 'SELECT')",
            &[&roles_a.role("runtime")],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        ungranted.is_empty(),
        "tables the runtime role cannot read: {ungranted:?}"
    );
    drop(db);
    env_a.cleanup().await;
    env_b.cleanup().await;
}

/// The README's roles flow on a machine where the plain flow ran first: the
/// configured database exists, owned by `postgres` (a plain `migrate` made it).
/// `up --roles` leaves it alone and says so, gives the roles a database, namespace
/// and key prefix of their own, and `migrate` then works as their owner (issue 51).
#[actix_rt::test]
async fn up_roles_after_the_plain_flow_gets_a_database_of_its_own_and_migrate_works() {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let plain = format!("seckill_plain_{id}");
    let admin = seckill_engine::store::connect(&admin_config())
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {plain}"))
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("seckill-roles-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    // Dropped at the end: the roles' database, their roles and users.
    let identities = Identities {
        dir: dir.clone(),
        users: format!("t{id}"),
        db: format!("{plain}_roles"),
    };
    let (namespace, prefix) = (format!("n{id}"), format!("p{id}"));
    let env = [
        ("SECKILL_SERVICES_DIR", dir.display().to_string()),
        ("SECKILL_ROLES_USER_PREFIX", identities.users.clone()),
        ("SECKILL__AMQP__NAMESPACE", namespace.clone()),
        ("SECKILL__REDIS__KEY_PREFIX", prefix.clone()),
        (
            "SECKILL__DATABASE__URL",
            crate::common::with_dbname(base_settings().database.url.expose_secret(), &plain),
        ),
    ];
    let text = crate::common::project_script("scripts/services", &["up", "--roles"], &env).await;
    assert!(
        text.contains(&format!("database {plain} is owned by postgres"))
            && text.contains(&format!("{plain}_roles")),
        "{text}"
    );
    let settings = std::fs::read_to_string(identities.settings_file()).unwrap();
    for want in [
        format!("/{plain}_roles?"),
        format!("namespace = \"{namespace}_roles\""),
        format!("key_prefix = \"{prefix}_roles\""),
    ] {
        assert!(settings.contains(&want), "{want} in {settings}");
    }
    // The documented next step, as the roles' owner, on their own database.
    let mut migrate = engine();
    migrate
        .arg("--config")
        .arg(identities.settings_file())
        .arg("migrate");
    let migrated =
        actix_rt::task::spawn_blocking(move || crate::common::process::run(&mut migrate))
            .await
            .unwrap();
    assert!(migrated.ok, "{}", migrated.text);
    // `validate` says when the owner setting cannot migrate: the roles' owner
    // pointed at the plain flow's database.
    let mut validate = engine();
    validate
        .arg("--config")
        .arg(identities.settings_file())
        .arg("validate")
        .env(
            "SECKILL__DATABASE__OWNER_URL",
            crate::common::with_dbname(&url_as(&format!("{plain}_roles_owner")), &plain),
        );
    let validated =
        actix_rt::task::spawn_blocking(move || crate::common::process::run(&mut validate))
            .await
            .unwrap();
    assert!(!validated.ok, "{}", validated.text);
    assert!(
        validated
            .text
            .lines()
            .any(|l| l.starts_with("FAIL owner") && l.contains("is owned by postgres")),
        "{}",
        validated.text
    );
    // The plain flow's database is as it was: still postgres's.
    let owner: String = admin
        .query_one(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1",
            &[&plain],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "postgres");
    admin
        .batch_execute(&format!("DROP DATABASE {plain} WITH (FORCE)"))
        .await
        .unwrap();
    drop(identities);
}
