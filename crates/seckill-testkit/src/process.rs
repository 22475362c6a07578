//! The engine as a process: its binary, one-shot commands, and `serve` processes a
//! test starts, signals and reads the logs of.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrecy::ExposeSecret;

use crate::{TestEnv, HANG, TEST_JWT_SECRET, TEST_PURCHASE_SECRET};

/// The `seckill-engine` binary of this build: `SECKILL_ENGINE_BIN` if set, else
/// what cargo names when it runs the test (`CARGO_BIN_EXE_seckill-engine`), else
/// `seckill-engine` in the target directory the test runs from
/// (`target/<profile>/deps/<test>`). Cargo builds it for the engine's own
/// integration tests, and `cargo test --workspace` for every crate's tests.
///
/// (Cargo's compile-time `env!("CARGO_BIN_EXE_...")` exists only in the integration
/// tests of the package that has the binary, never in a library such as this one,
/// hence the look-up at run time.)
pub fn engine_binary() -> PathBuf {
    for var in ["SECKILL_ENGINE_BIN", "CARGO_BIN_EXE_seckill-engine"] {
        if let Some(bin) = std::env::var_os(var) {
            return PathBuf::from(bin);
        }
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = profile_dir.join(format!("seckill-engine{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: build it (`cargo build --bin seckill-engine`, or `cargo test --workspace`, which builds it) or set SECKILL_ENGINE_BIN",
        bin.display()
    );
    bin
}

/// A command running the engine binary, logging warnings, with the tests' token
/// secrets.
pub fn engine() -> Command {
    let mut cmd = Command::new(engine_binary());
    cmd.env("RUST_LOG", "warn")
        .env("SECKILL__FRONTSTAGE__AUTH__HS256_SECRET", TEST_JWT_SECRET)
        .env(
            "SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET",
            TEST_PURCHASE_SECRET,
        );
    cmd
}

/// What a one-shot command did: whether it succeeded, and its stdout then stderr.
pub struct Output {
    pub ok: bool,
    pub text: String,
}

/// Runs `cmd` to its end.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run the command");
    Output {
        ok: out.status.success(),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Environment that points the binary at a test's private database, broker names and
/// Redis prefix.
pub fn env_of<'a>(cmd: &'a mut Command, env: &TestEnv) -> &'a mut Command {
    cmd.env(
        "SECKILL__DATABASE__URL",
        env.settings.database.url.expose_secret(),
    )
    .env("SECKILL__AMQP__NAMESPACE", &env.settings.amqp.namespace)
    .env("SECKILL__REDIS__KEY_PREFIX", &env.settings.redis.key_prefix)
    // Any free ports: several serve processes may run at once.
    .env("SECKILL__HTTP__ADDR", "127.0.0.1:0")
    .env("SECKILL__ADMIN__ADDR", "127.0.0.1:0")
    // Queue arguments must match what the test's in-process engines declare.
    .env(
        "SECKILL__AMQP__RETRY_DELAY_MS",
        env.settings.amqp.retry_delay_ms.to_string(),
    )
}

/// Sends `sig` (`-KILL`, `-STOP`, ...) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// How long `serve` may take to log readiness: it only bounds a hang (connecting to
/// three services, declaring the topology, leasing a node id on a loaded machine).
pub const STARTUP: Duration = HANG;

/// What a `serve` process has logged so far. `ended` tells waiters of each new line
/// and becomes true once the process has closed its stderr.
struct Log {
    text: Mutex<String>,
    ended: tokio::sync::watch::Sender<bool>,
}

/// A `serve` process under test; its stderr is read to the end on a thread of its own
/// (so it never writes into a closed pipe) and kept, for waits on a log line and for
/// failure messages.
pub struct Serve {
    /// `None` once waited for.
    child: Option<std::process::Child>,
    reader: Option<std::thread::JoinHandle<()>>,
    log: Arc<Log>,
}

impl Drop for Serve {
    /// A failed test must not leave its engine running.
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Serve {
    /// Starts `serve` logging at INFO and waits until it logged `ready_line` (or
    /// exited, or `STARTUP` passed): the process, and whether it became ready.
    pub async fn start(cmd: &mut Command, ready_line: &str) -> (Serve, bool) {
        Self::start_logging(cmd, ready_line, "info").await
    }

    /// Like `start`, with the log filter `filter`. The command gets `serve` unless
    /// it has it already (with its own flags after it: `serve --role front`).
    pub async fn start_logging(cmd: &mut Command, ready_line: &str, filter: &str) -> (Serve, bool) {
        if !cmd.get_args().any(|a| a == "serve") {
            cmd.arg("serve");
        }
        let mut child = cmd
            .env("RUST_LOG", filter)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Log {
            text: Mutex::new(String::new()),
            ended: tokio::sync::watch::Sender::new(false),
        });
        let reader = {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut text = log.text.lock().unwrap();
                    text.push_str(&line);
                    text.push('\n');
                    drop(text);
                    log.ended.send_modify(|_| {});
                }
                log.ended.send_replace(true);
            })
        };
        let serve = Serve {
            child: Some(child),
            reader: Some(reader),
            log,
        };
        let ready = serve.wait_for_line(ready_line, STARTUP).await;
        (serve, ready)
    }

    /// Waits until the process has logged a line containing `needle`: false if it
    /// ended its log (exited) or `budget` passed first.
    pub async fn wait_for_line(&self, needle: &str, budget: Duration) -> bool {
        let mut news = self.log.ended.subscribe();
        let logged = async {
            loop {
                // Seen before the text is read: a line added after that is news.
                let ended = *news.borrow_and_update();
                if self.log.text.lock().unwrap().contains(needle) {
                    return true;
                }
                if ended || news.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(budget, logged).await.unwrap_or(false)
    }

    /// Everything the process has logged so far.
    pub fn logged(&self) -> String {
        self.log.text.lock().unwrap().clone()
    }

    /// Sends SIGTERM.
    pub fn signal(&self) {
        signal(self.pid(), "-TERM");
    }

    /// Sends SIGTERM and returns the exit status and everything it logged.
    pub async fn terminate(self) -> (ExitStatus, String) {
        self.signal();
        self.wait().await
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Waits for the process to exit: its status and everything it logged.
    pub async fn wait(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("not waited for yet");
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        if let Some(reader) = self.reader.take() {
            tokio::task::spawn_blocking(move || reader.join())
                .await
                .unwrap()
                .unwrap();
        }
        (status, self.logged())
    }
}

/// `text` without ANSI colour sequences (`ESC [ ... m`).
pub fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
