//! The cores this process may use, and the sizes that follow from them when the
//! settings leave them automatic (`engine.pipeline_threads = 0`,
//! `frontstage.workers = 0`). In a container the CPU quota is what the process gets,
//! whatever the host has; outside one, the affinity mask (`taskset`, a cpuset); else
//! what the standard library sees. Read from files only (`/sys/fs/cgroup`,
//! `/proc/self/status`), so a host that has none of them falls through to the next.

use std::fmt;

/// The order pipeline's lanes when automatic: half the cores, since an `all`
/// process also runs the front stage's workers and the runtime's own threads (on the
/// 2-core reference host, shared with PostgreSQL and RabbitMQ, a second lane sold a
/// hot bucket 13 % slower: docs/BENCHMARKS.md, "One instance, several threads").
pub const MAX_AUTO_LANES: usize = 16;
/// The front stage's workers when automatic: one per core, at most this many.
pub const MAX_AUTO_WORKERS: usize = 32;

/// Where the core count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The cgroup's CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), rounded up.
    CgroupQuota,
    /// The CPUs the affinity mask allows (`Cpus_allowed_list`).
    Affinity,
    /// `std::thread::available_parallelism`.
    Parallelism,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::CgroupQuota => "cgroup CPU quota",
            Source::Affinity => "affinity mask",
            Source::Parallelism => "available parallelism",
        })
    }
}

/// How many cores, and from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cores {
    pub count: usize,
    pub source: Source,
}

impl Cores {
    /// The cores of this process, as the files say now.
    pub fn detect() -> Cores {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let quota = read("/sys/fs/cgroup/cpu.max")
            .and_then(|text| quota_v2(&text))
            .or_else(|| {
                let quota = read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")?;
                let period = read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")?;
                quota_v1(&quota, &period)
            });
        let affinity = read("/proc/self/status").and_then(|text| affinity(&text));
        let parallelism = std::thread::available_parallelism().map_or(1, |n| n.get());
        decide(quota, affinity, parallelism)
    }

    /// `engine.pipeline_threads` when set to 0: half the cores, at least one.
    pub fn auto_lanes(self) -> usize {
        (self.count / 2).clamp(1, MAX_AUTO_LANES)
    }

    /// `frontstage.workers` when set to 0: one per core.
    pub fn auto_workers(self) -> usize {
        self.count.clamp(1, MAX_AUTO_WORKERS)
    }
}

/// The quota first (a container gets that much CPU time whatever it may run on),
/// bounded by the affinity mask; then the mask; then what std sees.
fn decide(quota: Option<usize>, affinity: Option<usize>, parallelism: usize) -> Cores {
    match (quota, affinity) {
        (Some(q), Some(a)) if q <= a => Cores {
            count: q,
            source: Source::CgroupQuota,
        },
        (Some(q), None) => Cores {
            count: q,
            source: Source::CgroupQuota,
        },
        (_, Some(a)) => Cores {
            count: a,
            source: Source::Affinity,
        },
        (None, None) => Cores {
            count: parallelism.max(1),
            source: Source::Parallelism,
        },
    }
}

/// cgroup v2 `cpu.max`: `max 100000` (no quota) or `QUOTA PERIOD`.
fn quota_v2(text: &str) -> Option<usize> {
    let mut words = text.split_whitespace();
    let (quota, period) = (words.next()?, words.next()?);
    cores_of(quota.parse().ok()?, period.parse().ok()?)
}

/// cgroup v1: `cpu.cfs_quota_us` (-1: no quota) and `cpu.cfs_period_us`.
fn quota_v1(quota: &str, period: &str) -> Option<usize> {
    let quota: i64 = quota.trim().parse().ok()?;
    cores_of(u64::try_from(quota).ok()?, period.trim().parse().ok()?)
}

/// A quota in cores, rounded up (1.5 cores of CPU time keep two threads busy).
fn cores_of(quota: u64, period: u64) -> Option<usize> {
    (quota > 0 && period > 0).then(|| usize::try_from(quota.div_ceil(period)).unwrap_or(1))
}

/// The CPUs of `Cpus_allowed_list:` in `/proc/self/status`: `0-3,8,10-11`.
fn affinity(status: &str) -> Option<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim();
    let mut count = 0usize;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        count += match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (usize, usize) = (lo.parse().ok()?, hi.parse().ok()?);
                hi.checked_sub(lo)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_comes_first_then_the_affinity_mask_then_std() {
        assert_eq!(quota_v2("max 100000\n"), None);
        assert_eq!(quota_v2("150000 100000\n"), Some(2));
        assert_eq!(quota_v2("400000 100000"), Some(4));
        assert_eq!(quota_v1("-1\n", "100000\n"), None);
        assert_eq!(quota_v1("50000\n", "100000\n"), Some(1));
        assert_eq!(
            affinity("Name:\tx\nCpus_allowed_list:\t0-3,8,10-11\n"),
            Some(7)
        );
        assert_eq!(affinity("Cpus_allowed_list:\t5\n"), Some(1));
        assert_eq!(affinity("Cpus_allowed_list:\t3-1\n"), None);

        let quota = decide(Some(4), Some(16), 16);
        assert_eq!((quota.count, quota.source), (4, Source::CgroupQuota));
        // A quota above the mask cannot be used: the mask bounds it.
        let mask = decide(Some(32), Some(8), 8);
        assert_eq!((mask.count, mask.source), (8, Source::Affinity));
        let std = decide(None, None, 3);
        assert_eq!((std.count, std.source), (3, Source::Parallelism));
    }

    #[test]
    fn automatic_sizes_follow_the_cores_within_their_caps() {
        let of = |count| Cores {
            count,
            source: Source::Affinity,
        };
        assert_eq!((of(1).auto_lanes(), of(1).auto_workers()), (1, 1));
        assert_eq!((of(2).auto_lanes(), of(2).auto_workers()), (1, 2));
        assert_eq!((of(16).auto_lanes(), of(16).auto_workers()), (8, 16));
        assert_eq!((of(128).auto_lanes(), of(128).auto_workers()), (16, 32));
    }
}
