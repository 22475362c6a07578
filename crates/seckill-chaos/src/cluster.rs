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
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?sslmode=disable",
            self.pg_port
        )
    }
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.redis_port)
    }

    /// Runs `scripts/services ARGS` against these instances.
    pub fn services(&self, args: &[&str]) -> anyhow::Result<String> {
        script_output(
            Command::new(&self.script)
                .env("SECKILL_SERVICES_DIR", &self.dir)
                .env("SECKILL__DATABASE__URL", self.pg_url("seckill"))
                .env("SECKILL__AMQP__URL", self.amqp_url())
                .env("SECKILL__REDIS__URL", self.redis_url()),
            "scripts/services",
            args,
        )
    }

    /// `scripts/services up FLAG` for a topology of a scenario's own (`env`: its
    /// directory and ports) beside these services, which answer, so `up` uses them.
    pub fn up_beside(&self, env: Vec<(&str, String)>, flag: &str) -> anyhow::Result<String> {
        script_output(
            Command::new(&self.script)
                .envs(env)
                .env("SECKILL__DATABASE__URL", self.pg_url("seckill"))
                .env("SECKILL__AMQP__URL", self.amqp_url())
                .env("SECKILL__REDIS__URL", self.redis_url()),
            "scripts/services",
            &["up", flag],
        )
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

/// Runs one of the project's scripts (`name`, for the error) to its end: its
/// output, or an error with it when it failed.
fn script_output(cmd: &mut Command, name: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = cmd
        .args(args)
        .output()
        .with_context(|| format!("running {name}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("{name} {args:?} failed:\n{text}");
    }
    Ok(text)
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
        let mut env = topology.env();
        env.push(("HA_SYNC", if sync { "on" } else { "off" }.to_owned()));
        cluster.up_beside(env, "--ha")?;
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
            "postgres://postgres@{}/{db}?target_session_attrs=read-write&sslmode=disable",
            hosts.join(",")
        )
    }

    /// `scripts/failover ARGS`.
    pub fn failover(&self, args: &[&str]) -> anyhow::Result<String> {
        script_output(
            Command::new(self.script.with_file_name("failover")).envs(self.env()),
            "scripts/failover",
            args,
        )
    }

    /// The servers `scripts/failover status` shows as standbys (`pgN`).
    pub fn standbys(&self) -> anyhow::Result<Vec<String>> {
        // Its exit status says whether a server is down; the lines say the roles.
        let out = Command::new(self.script.with_file_name("failover"))
            .arg("status")
            .envs(self.env())
            .output()
            .context("running scripts/failover status")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                // `pg1:      127.0.0.1:5433  standby, sync, ...`
                let mut words = l.split_whitespace();
                let name = words.next()?.strip_suffix(':')?;
                let role = words.nth(1)?;
                role.starts_with("standby").then(|| name.to_owned())
            })
            .collect())
    }

    /// Stops the three servers.
    pub fn stop(&self) {
        let _ = Command::new(&self.script)
            .arg("down")
            .envs(self.env())
            .output();
    }
}

/// A Redis Sentinel topology or a three-node RabbitMQ cluster of one scenario
/// (`scripts/services up --redis-ha` or `up --amqp-cluster` in a directory of its
/// own, on free ports), broken with the script's own commands.
#[derive(Clone)]
pub struct ServiceTopology {
    pub kind: Extra,
    pub dir: PathBuf,
    pub ports: Vec<u16>,
    script: PathBuf,
}

/// Which extra topology a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    /// A Redis master, a replica and three sentinels (`up --redis-ha`).
    RedisHa,
    /// Three clustered RabbitMQ nodes (`up --amqp-cluster`).
    AmqpCluster,
}

impl Extra {
    fn flag(self) -> &'static str {
        match self {
            Extra::RedisHa => "--redis-ha",
            Extra::AmqpCluster => "--amqp-cluster",
        }
    }
    fn ports_var(self) -> &'static str {
        match self {
            Extra::RedisHa => "SECKILL_REDIS_HA_PORTS",
            Extra::AmqpCluster => "SECKILL_AMQP_CLUSTER_PORTS",
        }
    }
    fn port_count(self) -> usize {
        match self {
            Extra::RedisHa => 5,
            Extra::AmqpCluster => 3,
        }
    }
    fn settings_file(self) -> &'static str {
        match self {
            Extra::RedisHa => "redis-ha.toml",
            Extra::AmqpCluster => "amqp-cluster.toml",
        }
    }
}

impl ServiceTopology {
    pub fn start(cluster: &Cluster, name: &str, kind: Extra) -> anyhow::Result<ServiceTopology> {
        let topology = ServiceTopology {
            kind,
            dir: cluster.dir.join(format!("{}-{name}", &kind.flag()[2..])),
            ports: (0..kind.port_count()).map(|_| free_port()).collect(),
            script: cluster.script.clone(),
        };
        std::fs::create_dir_all(&topology.dir)?;
        let out = cluster.up_beside(topology.env(), kind.flag())?;
        if !topology.settings().is_file() {
            bail!(
                "scripts/services up {} wrote no settings:\n{out}",
                kind.flag()
            );
        }
        Ok(topology)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("SECKILL_SERVICES_DIR", self.dir.display().to_string()),
            (
                self.kind.ports_var(),
                self.ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        ]
    }

    /// The engine settings the script wrote for this topology (a `--config` file).
    pub fn settings(&self) -> PathBuf {
        self.dir.join(self.kind.settings_file())
    }

    /// `scripts/services ARGS` against this topology; its output.
    pub fn services(&self, args: &[&str]) -> anyhow::Result<String> {
        script_output(
            Command::new(&self.script).envs(self.env()),
            "scripts/services",
            args,
        )
    }

    /// The AMQP cluster node (1, 2 or 3) that holds most of the engines' order
    /// intake connections (named `seckill-intake…`), as node `ask` lists the
    /// cluster's connections.
    pub fn node_of_intakes(&self, ask: usize) -> anyhow::Result<Option<usize>> {
        let out = self.services(&[
            "amqp-cluster-ctl",
            &ask.to_string(),
            "list_connections",
            "-q",
            "port",
            "client_properties",
        ])?;
        let mut counts = [0usize; 3];
        for line in out.lines().filter(|l| l.contains("seckill-intake")) {
            let port = line.split_whitespace().next().and_then(|p| p.parse().ok());
            if let Some(i) = self.ports.iter().position(|p| Some(*p) == port) {
                counts[i] += 1;
            }
        }
        let best = (0..3).max_by_key(|i| counts[*i]).unwrap_or(0);
        Ok((counts[best] > 0).then_some(best + 1))
    }

    /// Stops the topology's processes.
    pub fn stop(&self) {
        let _ = Command::new(&self.script)
            .arg("down")
            .envs(self.env())
            .output();
    }
}
