//! Where this host's CPU went during a bench run. On the two-core machines the
//! targets are set for, PostgreSQL, RabbitMQ, the engine and the bench itself share
//! the cores, so a latency figure means little without knowing how busy they were.
//! Two readings of `/proc` (the host's `/proc/stat` and every process's
//! `/proc/<pid>/stat`), one when the drive starts and one when every reservation is
//! settled, give each role's CPU time per order sold and the host's busy share.
//! Processes are told apart by their command name, so the figures are those of the
//! services on this host only; where `/proc` cannot be read there is no figure. The
//! engine is every process whose name starts with `seckill-engine`, so that a copied
//! binary (`seckill-engine-a`, an A/B run of two builds) still counts as the engine.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::Serialize;

/// CPU use between two readings.
#[derive(Debug, Serialize, PartialEq)]
pub struct CpuUse {
    pub seconds: f64,
    pub cores: usize,
    /// CPU time per order sold, in microseconds, by role: `postgres`, `rabbitmq`,
    /// `engine` (every process named `seckill-engine…`), `bench` (this one) and
    /// `other`.
    pub per_order_us: BTreeMap<&'static str, f64>,
    /// Each role's CPU time as a percentage of the host's capacity (all cores).
    pub share_percent: BTreeMap<&'static str, f64>,
    /// The host's time by state, as a percentage of its capacity: `user`
    /// (including nice), `system`, `irq` (hard and soft), `iowait`, `steal` (taken
    /// by the hypervisor for other guests) and `idle`.
    pub host_percent: BTreeMap<&'static str, f64>,
}

/// One reading.
pub struct Reading {
    at: Instant,
    /// The host's `cpu` line: user, nice, system, idle, iowait, irq, softirq, steal.
    host: [u64; 8],
    cores: usize,
    procs: Procs,
}

/// Per process (pid and start time, so a reused pid is another process): its role
/// and CPU ticks so far.
type Procs = HashMap<(u32, u64), (&'static str, u64)>;

impl Reading {
    /// None where `/proc/stat` cannot be read (not Linux).
    pub fn take() -> Option<Self> {
        let at = Instant::now();
        let (host, cores) = parse_host(&std::fs::read_to_string("/proc/stat").ok()?)?;
        let me = std::process::id();
        let mut procs = HashMap::new();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            // A process may end between the listing and the read.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some((comm, started, ticks)) = parse_process(&stat) {
                procs.insert((pid, started), (role(comm, pid == me), ticks));
            }
        }
        Some(Self {
            at,
            host,
            cores,
            procs,
        })
    }

    /// From `self` to `later`, per order for `orders` orders.
    pub fn until(&self, later: &Reading, orders: i64) -> CpuUse {
        let host: Vec<u64> = self
            .host
            .iter()
            .zip(later.host)
            .map(|(a, b)| b.saturating_sub(*a))
            .collect();
        let capacity = host.iter().sum::<u64>().max(1) as f64;
        let seconds = later.at.duration_since(self.at).as_secs_f64();
        let cores = later.cores;
        let mut ticks: BTreeMap<&'static str, u64> = ROLES.iter().map(|r| (*r, 0)).collect();
        for (key, (role, after)) in &later.procs {
            let before = self.procs.get(key).map_or(0, |(_, t)| *t);
            *ticks.entry(role).or_default() += after.saturating_sub(before);
        }
        // Ticks are in the same unit as the host's, whose total over the window is
        // every core's time: no clock rate needed.
        let cpu_seconds = |t: u64| t as f64 / capacity * seconds * cores as f64;
        let percent = |t: u64| 100.0 * t as f64 / capacity;
        CpuUse {
            seconds,
            cores,
            per_order_us: ticks
                .iter()
                .map(|(r, t)| (*r, 1e6 * cpu_seconds(*t) / orders.max(1) as f64))
                .collect(),
            share_percent: ticks.iter().map(|(r, t)| (*r, percent(*t))).collect(),
            host_percent: BTreeMap::from([
                ("user", percent(host[0] + host[1])),
                ("system", percent(host[2])),
                ("idle", percent(host[3])),
                ("iowait", percent(host[4])),
                ("irq", percent(host[5] + host[6])),
                ("steal", percent(host[7])),
            ]),
        }
    }
}

const ROLES: [&str; 5] = ["postgres", "rabbitmq", "engine", "bench", "other"];

/// The role of a process named `comm` (the kernel keeps 15 bytes of it); `me` is
/// the bench itself.
fn role(comm: &str, me: bool) -> &'static str {
    match comm {
        _ if me => "bench",
        "postgres" => "postgres",
        "beam.smp" => "rabbitmq",
        _ if comm.starts_with("seckill-engine") => "engine",
        _ => "other",
    }
}

/// The aggregate `cpu` line's first eight fields and the number of `cpuN` lines.
fn parse_host(stat: &str) -> Option<([u64; 8], usize)> {
    let mut host = [0u64; 8];
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    for (slot, field) in host.iter_mut().zip(line.split_whitespace().skip(1)) {
        *slot = field.parse().ok()?;
    }
    let cores = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    Some((host, cores.max(1)))
}

/// Command name, start time and user + system ticks of a `/proc/<pid>/stat` line.
/// The name is in parentheses and may itself hold spaces and parentheses, so the
/// fields are counted from the last `)`.
fn parse_process(stat: &str) -> Option<(&str, u64, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    // After the name: state is field 3; utime, stime are 14 and 15; starttime 22.
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some((comm, field(22)?, field(14)? + field(15)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_line_and_the_cores_are_read() {
        let stat = "cpu  100 5 30 800 10 0 4 6 0 0\ncpu0 50 0 15 400 5 0 2 3 0 0\n\
                    cpu1 50 5 15 400 5 0 2 3 0 0\nintr 1 2 3\nctxt 99\n";
        assert_eq!(parse_host(stat), Some(([100, 5, 30, 800, 10, 0, 4, 6], 2)));
    }

    #[test]
    fn a_process_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let stat = "4242 (postgres: a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 \
                    20 21 22 23";
        // utime = field 14 = 11, stime = 12, starttime = field 22 = 19.
        assert_eq!(parse_process(stat), Some(("postgres: a (b) c", 19, 23)));
    }

    #[test]
    fn a_copied_engine_binary_is_still_the_engine() {
        assert_eq!(role("seckill-bench", true), "bench");
        assert_eq!(role("seckill-engine", false), "engine");
        assert_eq!(role("seckill-engine-", false), "engine");
        assert_eq!(role("seckill-bench", false), "other");
        assert_eq!(role("engine-a", false), "other");
        assert_eq!(role("beam.smp", false), "rabbitmq");
    }

    #[test]
    fn roles_are_charged_what_they_used_in_between_and_per_order() {
        let at = Instant::now();
        let reading = |host: [u64; 8], procs: Procs| Reading {
            at,
            host,
            cores: 2,
            procs,
        };
        let before = reading(
            [100, 0, 0, 100, 0, 0, 0, 0],
            Procs::from([((1, 7), ("postgres", 40)), ((2, 7), ("engine", 10))]),
        );
        // 400 host ticks pass (two cores for 200 ticks): postgres uses 100 more,
        // the engine 50, a new process 30; pid 2 ends and is reused by another.
        let mut after = reading(
            [300, 0, 20, 280, 0, 0, 0, 0],
            Procs::from([
                ((1, 7), ("postgres", 140)),
                ((3, 9), ("rabbitmq", 30)),
                ((2, 8), ("engine", 50)),
            ]),
        );
        after.at = at + std::time::Duration::from_secs(2);
        let cpu = before.until(&after, 1_000);
        assert_eq!(cpu.share_percent["postgres"], 25.0);
        assert_eq!(cpu.share_percent["rabbitmq"], 7.5);
        assert_eq!(cpu.share_percent["engine"], 12.5);
        // 25 % of 2 cores for 2 s = 1 s of CPU over 1,000 orders.
        assert!((cpu.per_order_us["postgres"] - 1_000.0).abs() < 1e-6);
        assert_eq!(cpu.host_percent["idle"], 45.0);
        assert_eq!(cpu.host_percent["user"], 50.0);
    }
}
