//! The live page on the admin listener, in headless Chromium driven through
//! WebDriver (Debian's `chromium` and `chromium-driver`; `scripts/services tools`
//! installs them): during a sale its numbers change on their own, the screenshots
//! show it, and its pause button pauses the intake; when its database goes away it
//! says so at the top, at once, and shows what it cannot read as unknown.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::builders::{self, order};
use crate::common::process::{engine, env_of, Serve};
use crate::common::{consumers, count, free_port, poll_every, settle, wait_until, TestEnv, HANG};

/// The W3C WebDriver element key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session on it.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    client: awc::Client,
    _profile: tempdir::Dir,
}

mod tempdir {
    /// A directory removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Browser {
    async fn start() -> Browser {
        for binary in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                std::path::Path::new(binary).exists(),
                "{binary} is missing: run scripts/services tools"
            );
        }
        let port = free_port();
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish();
        let up = wait_until(HANG, || async {
            client
                .get(format!("{base}/status"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        assert!(up, "chromedriver did not answer");
        let profile = tempdir::Dir(
            std::env::temp_dir().join(format!("seckill-chromium-{}", uuid::Uuid::new_v4())),
        );
        // The flags Chromium needs on a machine with no display and no outside
        // network (docs: the sandbox runs as root; background fetches are refused).
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            // The screen issue 51 names: latency, backlog and dead letters must show
            // without scrolling on it.
            "--window-size=1400,900".to_owned(),
            format!("--user-data-dir={}", profile.0.display()),
        ];
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            client,
            _profile: profile,
        };
        let created = browser
            .call(
                "POST",
                "/session",
                Some(json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
                }}})),
            )
            .await;
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        browser
    }

    /// One WebDriver command; its `value`.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.client.get(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.post(url),
        };
        let mut res = match body {
            Some(body) => req.send_json(&body).await,
            None => req.send().await,
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let bytes = res.body().limit(64 << 20).await.expect("WebDriver answer");
        let value: Value = serde_json::from_slice(&bytes).expect("WebDriver JSON");
        assert!(
            res.status().is_success(),
            "{method} {path}: {} {value}",
            res.status()
        );
        value["value"].clone()
    }

    async fn session(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.call(method, &path, body).await
    }

    async fn open(&self, url: &str) {
        self.session("POST", "/url", Some(json!({ "url": url })))
            .await;
    }

    async fn element(&self, css: &str) -> String {
        let found = self
            .session(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_owned()
    }

    /// The element's text, or `None` while it is not on the page. The page redraws
    /// itself every second, so an element found may be replaced before its text is
    /// read: that is tried again.
    async fn text(&self, css: &str) -> Option<String> {
        for _ in 0..5 {
            let found = self
                .try_call("/element", json!({"using": "css selector", "value": css}))
                .await?;
            let id = found[ELEMENT].as_str()?;
            let url = format!("{}/session/{}/element/{id}/text", self.base, self.session);
            let Ok(mut res) = self.client.get(url).send().await else {
                continue;
            };
            if res.status().is_success() {
                let text: Value = res.json().await.ok()?;
                return text["value"].as_str().map(str::to_owned);
            }
        }
        None
    }

    /// A session command whose failure is an answer (`None`), not a test failure.
    async fn try_call(&self, path: &str, body: Value) -> Option<Value> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut res = self.client.post(url).send_json(&body).await.ok()?;
        if !res.status().is_success() {
            return None;
        }
        let found: Value = res.json().await.ok()?;
        Some(found["value"].clone())
    }

    async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.session(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.session("POST", &format!("/element/{id}/click"), Some(json!({})))
            .await;
    }

    /// A PNG of the page, saved under target/live-page/ for a person to look at.
    async fn screenshot(&self, name: &str) -> Vec<u8> {
        use base64::Engine;
        let encoded = self.session("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("base64 screenshot"))
            .expect("screenshot decodes");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/live-page");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join(format!("{name}.png")), &png);
        png
    }

    /// Waits until the element's text satisfies `ok` (`HANG` at most: the page
    /// polls the engine, and a loaded machine slows the browser); the text seen last.
    async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> Result<String, String> {
        poll_every(HANG, Duration::from_millis(100), || async {
            let text = self.text(css).await.unwrap_or_default();
            if ok(&text) {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await
        .map(|(_, text)| text)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[actix_rt::test]
async fn the_live_page_follows_the_sale_and_its_pause_button_pauses_the_intake() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 97, 1, 400, 4).await;
    let admin = format!("127.0.0.1:{}", free_port());
    let token = "test-admin-token-0123456789";
    let metrics_token = "test-metrics-token-0123456789";
    let mut cmd = engine();
    env_of(&mut cmd, &env)
        .env("SECKILL__ADMIN__ADDR", &admin)
        .env("SECKILL__ADMIN__TOKEN", token)
        .env("SECKILL__ADMIN__METRICS_TOKEN", metrics_token);
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    assert!(ready, "serve did not start");
    let browser = Browser::start().await;
    browser.open(&format!("http://{admin}/")).await;

    // /status is behind admin.metrics_token, so the page shows nothing until the
    // token is typed in.
    let plain = awc::Client::default();
    let unauthorized = plain
        .get(format!("http://{admin}/status"))
        .send()
        .await
        .expect("status");
    assert_eq!(unauthorized.status().as_u16(), 401);
    let content = browser.text("#content").await.unwrap_or_default();
    assert!(content.contains("Enter the metrics token"), "{content:?}");
    assert_eq!(browser.text("#sold-97-1").await, None);
    browser.type_into("#metrics-token", metrics_token).await;
    browser
        .wait_text("#sold-97-1", |t| t == "0")
        .await
        .unwrap_or_else(|t| panic!("the sale never showed with the token (last: {t:?})"));
    assert_eq!(
        browser.text("#available-97-1").await.as_deref(),
        Some("400")
    );
    let before = browser.screenshot("1-before").await;

    // Orders arrive; the page's polling shows them without a reload.
    let amqp = env.amqp().await;
    let msgs: Vec<_> = (1..=200).map(|u| order(97, 1, u, (u % 4) as i16)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    let sold = browser
        .wait_text("#sold-97-1", |t| t == "200")
        .await
        .unwrap_or_else(|t| panic!("the page never showed 200 sold (last: {t:?})"));
    assert_eq!(sold, "200");
    assert_eq!(
        browser.text("#available-97-1").await.as_deref(),
        Some("200")
    );
    let latency = browser.text("#latency").await.unwrap_or_default();
    assert!(latency.contains("p99"), "latency shown: {latency:?}");
    let after = browser.screenshot("2-after-200-orders").await;
    assert_ne!(before, after, "the screenshots show the numbers changing");

    // The pause button, with the operator token, pauses the intake.
    assert_eq!(
        browser.text("#intake-state").await.as_deref(),
        Some("intake running")
    );
    browser.type_into("#operator-token", token).await;
    browser.click("#pause").await;
    browser
        .wait_text("#intake-state", |t| t.starts_with("intake paused"))
        .await
        .unwrap_or_else(|t| panic!("the page never showed the pause (last: {t:?})"));
    let result = browser.text("#action-result").await.unwrap_or_default();
    assert!(result.starts_with("200"), "{result}");
    browser.screenshot("3-paused").await;
    // The intakes cancel their consumers just after the pause is answered.
    assert!(
        wait_until(settle(), || async {
            for shard in 0..env.settings.amqp.shards {
                if consumers(&amqp, &env.names.order_queue(shard)).await != Some(0) {
                    return false;
                }
            }
            true
        })
        .await,
        "the consumers were not cancelled"
    );
    let more: Vec<_> = (201..=220)
        .map(|u| order(97, 1, u, (u % 4) as i16))
        .collect();
    builders::publish(&env, &amqp, &more).await;
    // On purpose: a while for an order to be taken if the pause did not hold.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders").await,
        200,
        "no order is taken while paused"
    );

    // And resume takes the waiting orders.
    browser.click("#resume").await;
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM orders").await == 220
        })
        .await,
        "resume did not take the waiting orders"
    );
    browser
        .wait_text("#sold-97-1", |t| t == "220")
        .await
        .unwrap_or_else(|t| panic!("the page never showed 220 sold (last: {t:?})"));
    browser.session("DELETE", "", None).await;
    drop(browser);
    let (status, log) = serve.terminate().await;
    assert!(status.success(), "{log}");
    env.cleanup().await;
}

/// Issue 51: the page tells the truth during an outage. The engine reaches
/// PostgreSQL through a switch; cut, the red banner names PostgreSQL within 3 s,
/// the intake is not shown running, the sales are unknown (not "no sale"), and
/// `/status` still answers within 300 ms. The token comes in the URL's fragment.
#[actix_rt::test]
async fn the_live_page_says_at_once_that_its_database_is_down() {
    use secrecy::ExposeSecret;
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 98, 1, 400, 4).await;
    let url = env.settings.database.url.expose_secret().to_owned();
    let switch = crate::common::Switch::start(crate::common::target_of(&url, 5432)).await;
    let admin = format!("127.0.0.1:{}", free_port());
    let metrics_token = "test-metrics-token-9876543210";
    let mut cmd = engine();
    env_of(&mut cmd, &env)
        .env("SECKILL__DATABASE__URL", switch.url_through(&url))
        .env("SECKILL__ADMIN__ADDR", &admin)
        .env("SECKILL__ADMIN__METRICS_TOKEN", metrics_token);
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    assert!(ready, "serve did not start");
    let browser = Browser::start().await;
    // Given once in the fragment: kept for the tab, gone from the address bar.
    browser
        .open(&format!("http://{admin}/#metrics_token={metrics_token}"))
        .await;
    browser
        .wait_text("#sold-98-1", |t| t == "0")
        .await
        .unwrap_or_else(|t| panic!("the sale never showed (last: {t:?})"));
    let address = browser.session("GET", "/url", None).await;
    assert!(
        !address.as_str().unwrap_or_default().contains(metrics_token),
        "the token stayed in the address bar: {address}"
    );
    browser
        .wait_text("#intake-state", |t| t == "intake running")
        .await
        .unwrap_or_else(|t| panic!("the intake never showed running (last: {t:?})"));
    assert_eq!(browser.text("#banner").await.unwrap_or_default(), "");
    // Latency, backlog and dead letters without scrolling (a 1400×900 window).
    let below = browser
        .session(
            "POST",
            "/execute/sync",
            Some(json!({
                "script": "return ['latency', 'outbox', 'compensation', 'dead-letters']
                    .filter((id) => document.getElementById(id).getBoundingClientRect().bottom > window.innerHeight);",
                "args": [],
            })),
        )
        .await;
    assert_eq!(below, json!([]), "below the fold");
    browser.screenshot("4-database-up").await;

    let cut = std::time::Instant::now();
    switch.set(false);
    let banner = browser
        .wait_text("#banner", |t| t.contains("PostgreSQL unreachable"))
        .await
        .unwrap_or_else(|t| panic!("no outage banner (last: {t:?})"));
    let shown_after = cut.elapsed();
    assert!(
        shown_after <= Duration::from_secs(3),
        "the banner took {shown_after:?}: {banner}"
    );
    let intake = browser
        .wait_text("#intake-state", |t| !t.contains("running"))
        .await
        .unwrap_or_else(|t| panic!("the intake still shows running (last: {t:?})"));
    let sales = browser.text("#sales").await.unwrap_or_default();
    assert!(sales.contains("Unknown"), "{sales}");
    assert!(!sales.contains("No sale is live"), "{sales}");
    // Refreshing during the outage stays fast: the reads give up in time.
    let client = awc::Client::default();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let res = client
            .get(format!("http://{admin}/status"))
            .insert_header(("authorization", format!("Bearer {metrics_token}")))
            .send()
            .await
            .expect("status during the outage");
        assert_eq!(res.status().as_u16(), 200);
        let took = started.elapsed();
        assert!(took < Duration::from_millis(300), "/status took {took:?}");
    }
    browser.screenshot("5-database-down").await;
    eprintln!("outage banner after {shown_after:?}: {banner}; {intake}");

    switch.set(true);
    browser
        .wait_text("#banner", str::is_empty)
        .await
        .unwrap_or_else(|t| panic!("the banner stayed after the database came back (last: {t:?})"));
    browser
        .wait_text("#sold-98-1", |t| t == "0")
        .await
        .unwrap_or_else(|t| panic!("the sale did not come back (last: {t:?})"));
    browser.session("DELETE", "", None).await;
    drop(browser);
    let (status, log) = serve.terminate().await;
    assert!(status.success(), "{log}");
    // The outage is one WARN per background service that met it, not one per retry.
    let mut warned = std::collections::BTreeMap::<String, usize>::new();
    for line in log
        .lines()
        .filter(|l| l.contains("background service failing"))
    {
        let line = crate::common::process::without_colours(line);
        let service = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("service="))
            .unwrap_or("?")
            .to_owned();
        *warned.entry(service).or_default() += 1;
    }
    assert!(!warned.is_empty(), "no service said it was failing: {log}");
    assert!(warned.values().all(|n| *n == 1), "{warned:?}\n{log}");
    env.cleanup().await;
}
