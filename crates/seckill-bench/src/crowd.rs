//! A hostile crowd beside a sale (`--slow-clients`, `--idle-clients`): connections
//! that trickle a reservation body one byte at a time, and idle keep-alive
//! connections, each opened again as soon as the server closes it, as an attacker
//! would; and a probe of the engine's `/readyz` every 250 ms. What it reports says
//! whether the door held: how often the server cut the crowd off, and whether
//! readiness kept answering 200 within a second (issue 49, "Slowloris").

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the crowd did and what readiness answered meanwhile.
#[derive(Debug, Serialize, Default)]
pub struct CrowdReport {
    pub slow_clients: usize,
    pub idle_clients: usize,
    /// Connections the crowd opened (again), and those the server closed.
    pub opened: u64,
    pub closed_by_server: u64,
    /// Connects that failed (refused, or the server's accept queue full).
    pub connect_errors: u64,
    /// Body bytes trickled.
    pub trickled_bytes: u64,
    pub readyz_probes: u64,
    /// Probes that got no 200 within 1 s.
    pub readyz_failed: u64,
    pub readyz_max_ms: f64,
}

#[derive(Default)]
struct Counters {
    opened: AtomicU64,
    closed_by_server: AtomicU64,
    connect_errors: AtomicU64,
    trickled: AtomicU64,
    probes: AtomicU64,
    probe_failed: AtomicU64,
    probe_max_us: AtomicU64,
}

/// A running crowd; `finish` stops it.
pub struct Crowd {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    slow: usize,
    idle: usize,
}

/// Who the crowd is and whom it targets.
pub struct Target {
    pub front: SocketAddr,
    /// `POST` path of a reservation on the sale.
    pub path: String,
    /// Bearer tokens of users who are not buyers (one per slow client, reused).
    pub bearers: Vec<String>,
    /// The engine's `/readyz` URL.
    pub readyz: String,
    /// How long between two trickled bytes.
    pub trickle: Duration,
}

impl Crowd {
    pub fn start(target: Target, slow: usize, idle: usize) -> Crowd {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let target = Arc::new(target);
        let mut tasks = Vec::with_capacity(slow + idle + 1);
        for i in 0..slow {
            let (stop, counters, target) = (stop.clone(), counters.clone(), target.clone());
            tasks.push(tokio::spawn(async move {
                let bearer = &target.bearers[i % target.bearers.len().max(1)];
                let head = format!(
                    "POST {} HTTP/1.1\r\nHost: {}\r\nAuthorization: {bearer}\r\ncontent-type: application/json\r\ncontent-length: 60\r\n\r\n",
                    target.path, target.front
                );
                while !stop.load(Ordering::Relaxed) {
                    slow_client(&target, &head, &stop, &counters).await;
                }
            }));
        }
        for _ in 0..idle {
            let (stop, counters, target) = (stop.clone(), counters.clone(), target.clone());
            tasks.push(tokio::spawn(async move {
                let request = format!(
                    "GET /v1/reservations/00000000-0000-7000-8000-000000000000 HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\n\r\n",
                    target.front,
                    target.bearers.first().map_or("", String::as_str)
                );
                while !stop.load(Ordering::Relaxed) {
                    idle_client(&target, &request, &stop, &counters).await;
                }
            }));
        }
        let (stop_probe, counters_probe) = (stop.clone(), counters.clone());
        let readyz = target.readyz.clone();
        tasks.push(tokio::spawn(async move {
            probe_readyz(&readyz, &stop_probe, &counters_probe).await;
        }));
        Crowd {
            stop,
            counters,
            tasks,
            slow,
            idle,
        }
    }

    pub async fn finish(self) -> CrowdReport {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.abort();
            let _ = task.await;
        }
        let c = &self.counters;
        CrowdReport {
            slow_clients: self.slow,
            idle_clients: self.idle,
            opened: c.opened.load(Ordering::Relaxed),
            closed_by_server: c.closed_by_server.load(Ordering::Relaxed),
            connect_errors: c.connect_errors.load(Ordering::Relaxed),
            trickled_bytes: c.trickled.load(Ordering::Relaxed),
            readyz_probes: c.probes.load(Ordering::Relaxed),
            readyz_failed: c.probe_failed.load(Ordering::Relaxed),
            readyz_max_ms: c.probe_max_us.load(Ordering::Relaxed) as f64 / 1000.0,
        }
    }
}

async fn connect(target: &Target, counters: &Counters) -> Option<TcpStream> {
    match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(target.front)).await {
        Ok(Ok(stream)) => {
            counters.opened.fetch_add(1, Ordering::Relaxed);
            Some(stream)
        }
        _ => {
            counters.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            None
        }
    }
}

/// Whether the server has closed `stream` (or answered, which ends the request),
/// waiting at most `wait`.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 1024];
    matches!(
        tokio::time::timeout(wait, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// One connection that sends the head at once, then the body a byte per
/// `trickle`, until the server closes it.
async fn slow_client(target: &Target, head: &str, stop: &AtomicBool, counters: &Counters) {
    let Some(mut stream) = connect(target, counters).await else {
        return;
    };
    if stream.write_all(head.as_bytes()).await.is_err() {
        counters.closed_by_server.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut reader = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        if stream.write_all(b"{").await.is_err() {
            break;
        }
        counters.trickled.fetch_add(1, Ordering::Relaxed);
        // Until the next byte is due, watch for the server's answer or close.
        match tokio::time::timeout(target.trickle, stream.read(&mut reader)).await {
            Err(_) => continue,
            Ok(Ok(n)) if n > 0 => {
                // An answer (408, 429, 401): the server is done with this request;
                // read to the close.
                let _ = closed_within(&mut stream, Duration::from_secs(2)).await;
                break;
            }
            Ok(_) => break,
        }
    }
    if !stop.load(Ordering::Relaxed) {
        counters.closed_by_server.fetch_add(1, Ordering::Relaxed);
    }
}

/// One connection that makes one request, reads its answer, then stays open and
/// silent until the server closes it.
async fn idle_client(target: &Target, request: &str, stop: &AtomicBool, counters: &Counters) {
    let Some(mut stream) = connect(target, counters).await else {
        return;
    };
    if stream.write_all(request.as_bytes()).await.is_err() {
        counters.closed_by_server.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
            Err(_) => continue,
            Ok(Ok(n)) if n > 0 => continue,
            Ok(_) => break,
        }
    }
    counters.closed_by_server.fetch_add(1, Ordering::Relaxed);
}

/// `GET /readyz` every 250 ms, each within 1 s or failed.
async fn probe_readyz(url: &str, stop: &AtomicBool, counters: &Counters) {
    let client = crate::http_client::HttpClient::new(Duration::from_secs(1));
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let ok = matches!(client.get(url, &[]).await, Ok(res) if res.status == 200);
        let took = started.elapsed();
        counters.probes.fetch_add(1, Ordering::Relaxed);
        if !ok || took > Duration::from_secs(1) {
            counters.probe_failed.fetch_add(1, Ordering::Relaxed);
        }
        counters.probe_max_us.fetch_max(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
