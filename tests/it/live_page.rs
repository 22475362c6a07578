//! The live page on the admin listener, in headless Chromium driven through
//! WebDriver (Debian's `chromium` and `chromium-driver`; `scripts/services tools`
//! installs them): during a sale its numbers change on their own, the screenshots
//! show it, and its pause button pauses the intake.

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
            "--window-size=1200,1400".to_owned(),
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
        .wait_text("#intake-state", |t| t == "intake paused")
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
