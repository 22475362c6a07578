//! The harness's own PostgreSQL, RabbitMQ and Redis (started by `scripts/services` on
//! free ports under a private directory, so they can be crashed without touching
//! anyone else's), and engine processes it can kill, stop and restart.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Finds `scripts/services` at run time: the working directory or the nearest of
/// its ancestors that holds it (a checkout of the repository; tests run in the crate's
/// directory below it).
pub fn find_services_script() -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir().context("reading the working directory")?;
    for dir in cwd.ancestors() {
        let script = dir.join("scripts/services");
        if script.is_file() {
            return Ok(script);
        }
    }
    bail!(
        "scripts/services was not found in {} or above it; run from a checkout of the repository or pass --services-script",
        cwd.display()
    )
}

/// A free local port whose RabbitMQ distribution port (port + 20000) is free too.
pub fn free_port() -> u16 {
    loop {
        let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = listener.local_addr() else {
            continue;
        };
        let port = addr.port();
        if port < 45000 && std::net::TcpListener::bind(("127.0.0.1", port + 20000)).is_ok() {
            return port;
        }
    }
}

/// Private instances of the three services.
pub struct Cluster {
    pub dir: PathBuf,
    /// `scripts/services`, which starts, stops and breaks the instances.
    pub script: PathBuf,
    pub pg_port: u16,
    pub amqp_port: u16,
    pub redis_port: u16,
}

impl Cluster {
    pub fn start(dir: &Path, script: PathBuf) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        let cluster = Cluster {
            dir: dir.to_owned(),
            script,
            pg_port: free_port(),
            amqp_port: free_port(),
            redis_port: free_port(),
        };
        cluster.services(&["up"])?;
        Ok(cluster)
    }

    pub fn pg_url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.pg_port)
    }
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.redis_port)
    }

    /// Runs `scripts/services ARGS` against these instances.
    pub fn services(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.script)
            .args(args)
            .env("SECKILL_SERVICES_DIR", &self.dir)
            .env("SECKILL__DATABASE__URL", self.pg_url("seckill"))
            .env("SECKILL__AMQP__URL", self.amqp_url())
            .env("SECKILL__REDIS__URL", self.redis_url())
            .output()
            .context("running scripts/services")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            bail!("scripts/services {args:?} failed:\n{text}");
        }
        Ok(text)
    }

    /// `pg_ctl stop -m immediate` by signal: the postmaster gets SIGQUIT, every
    /// backend dies without a checkpoint, and recovery replays the WAL on restart.
    pub async fn pg_crash(&self) -> anyhow::Result<()> {
        let pid_file = self.dir.join("postgres/data/postmaster.pid");
        let text = std::fs::read_to_string(&pid_file).context("reading postmaster.pid")?;
        let pid = text.lines().next().unwrap_or("").trim().to_owned();
        signal(&pid, "QUIT")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    pub fn rabbitmqctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["rabbitmqctl"];
        all.extend_from_slice(args);
        self.services(&all)
    }

    pub async fn redis(&self) -> anyhow::Result<::redis::aio::MultiplexedConnection> {
        Ok(::redis::Client::open(self.redis_url())?
            .get_multiplexed_async_connection()
            .await?)
    }

    /// The rules of the network cut, each as iptables arguments after the chain.
    pub fn net_rules(&self) -> Vec<Vec<String>> {
        let rule = |port: u16, extra: &[&str]| {
            let mut r: Vec<String> = ["OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            r.push(port.to_string());
            r.extend(extra.iter().map(|s| s.to_string()));
            r
        };
        vec![
            rule(self.pg_port, &["-j", "DROP"]),
            rule(
                self.amqp_port,
                &["-j", "REJECT", "--reject-with", "tcp-reset"],
            ),
            rule(
                self.redis_port,
                &[
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    "0.2",
                    "-j",
                    "DROP",
                ],
            ),
        ]
    }

    pub fn stop(&self) {
        let _ = self.services(&["down"]);
    }
}

/// Sends a signal by name to a pid (through `kill`, no unsafe code).
pub fn signal(pid: &str, name: &str) -> anyhow::Result<()> {
    let ok = Command::new("kill")
        .args([format!("-{name}"), pid.to_owned()])
        .status()?
        .success();
    if !ok {
        bail!("kill -{name} {pid} failed");
    }
    Ok(())
}

/// One engine (`seckill-engine serve`) as a child process.
pub struct EngineProc {
    exe: PathBuf,
    env: Vec<(String, String)>,
    /// Failpoints armed on the next start, if any.
    pub failpoints: Option<String>,
    pub log: PathBuf,
    pub admin_port: u16,
    child: Option<Child>,
    pub starts: u32,
}

impl EngineProc {
    pub fn new(exe: &Path, env: Vec<(String, String)>, log: PathBuf) -> EngineProc {
        let admin_port = free_port();
        EngineProc {
            exe: exe.to_owned(),
            env,
            failpoints: None,
            log,
            admin_port,
            child: None,
            starts: 0,
        }
    }

    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .context("opening the engine log")?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("serve")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(
                "SECKILL__ADMIN__ADDR",
                format!("127.0.0.1:{}", self.admin_port),
            )
            .env_remove("FAILPOINTS")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(fp) = &self.failpoints {
            cmd.env("FAILPOINTS", fp);
        }
        self.child = Some(cmd.spawn().context("starting the engine")?);
        self.starts += 1;
        Ok(())
    }

    pub fn pid(&self) -> Option<String> {
        self.child.as_ref().map(|c| c.id().to_string())
    }

    /// Whether the process has exited (a failpoint abort, or a kill).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn sigstop(&self) -> anyhow::Result<()> {
        signal(&self.pid().unwrap_or_default(), "STOP")
    }
    pub fn sigcont(&self) -> anyhow::Result<()> {
        signal(&self.pid().unwrap_or_default(), "CONT")
    }

    /// SIGTERM and wait (the graceful drain) up to `timeout`, then SIGKILL.
    pub async fn stop(&mut self, timeout: Duration) {
        if let Some(pid) = self.pid() {
            let _ = signal(&pid, "CONT");
            let _ = signal(&pid, "TERM");
        }
        let deadline = Instant::now() + timeout;
        while !self.exited() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill9();
    }

    /// Waits until `/readyz` answers 200 (or the process died).
    pub async fn wait_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.exited() {
                return false;
            }
            if http_status(self.admin_port, "/readyz").await == Some(200) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
}

impl Drop for EngineProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The status code of a plain HTTP/1.0 GET, or `None` if nothing answered.
async fn http_status(port: u16, path: &str) -> Option<u16> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

/// Installs iptables (Debian package) if it is missing.
pub fn iptables_ensure() -> anyhow::Result<()> {
    if Command::new("iptables").arg("--version").output().is_ok() {
        return Ok(());
    }
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-q", "iptables"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get (root is needed for the network cut)")?
        .success();
    if !ok {
        bail!("apt-get install iptables failed");
    }
    Ok(())
}

/// `iptables OP RULE...` (OP: -I to add, -D to delete).
pub fn iptables(op: &str, rule: &[String]) -> anyhow::Result<()> {
    let out = Command::new("iptables").arg(op).args(rule).output()?;
    if !out.status.success() {
        bail!(
            "iptables {op} {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A PostgreSQL primary with two streaming standbys of one scenario
/// (`scripts/services up --ha` in a directory of its own), broken and repaired with
/// `scripts/failover`.
#[derive(Clone)]
pub struct HaTopology {
    pub dir: PathBuf,
    pub ports: [u16; 3],
    /// `scripts/services`; `scripts/failover` is next to it.
    script: PathBuf,
}

impl HaTopology {
    /// `sync`: a synchronous quorum of one; otherwise asynchronous standbys.
    pub fn start(cluster: &Cluster, name: &str, sync: bool) -> anyhow::Result<HaTopology> {
        let topology = HaTopology {
            dir: cluster.dir.join(format!("ha-{name}")),
            ports: [free_port(), free_port(), free_port()],
            script: cluster.script.clone(),
        };
        std::fs::create_dir_all(&topology.dir)?;
        // The plain services are the cluster's (they answer, so `up` uses them).
        let out = Command::new(&topology.script)
            .args(["up", "--ha"])
            .envs(topology.env())
            .env("SECKILL__DATABASE__URL", cluster.pg_url("seckill"))
            .env("SECKILL__AMQP__URL", cluster.amqp_url())
            .env("SECKILL__REDIS__URL", cluster.redis_url())
            .env("HA_SYNC", if sync { "on" } else { "off" })
            .output()
            .context("running scripts/services up --ha")?;
        if !out.status.success() {
            bail!(
                "scripts/services up --ha failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(topology)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("SECKILL_SERVICES_DIR", self.dir.display().to_string()),
            (
                "SECKILL_HA_PORTS",
                self.ports.map(|p| p.to_string()).join(" "),
            ),
        ]
    }

    /// libpq's multi-host URL naming all three servers.
    pub fn url(&self, db: &str) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "postgres://postgres@{}/{db}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// `scripts/failover ARGS`.
    pub fn failover(&self, args: &[&str]) -> anyhow::Result<String> {
        let script = self.script.with_file_name("failover");
        let out = Command::new(&script)
            .args(args)
            .envs(self.env())
            .output()
            .context("running scripts/failover")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            bail!("scripts/failover {args:?} failed:\n{text}");
        }
        Ok(text)
    }

    /// Stops the three servers.
    pub fn stop(&self) {
        let _ = Command::new(&self.script)
            .arg("down")
            .envs(self.env())
            .output();
    }
}
