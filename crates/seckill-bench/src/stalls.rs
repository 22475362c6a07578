//! Stalls of the host itself during a bench run. On a virtual machine the hypervisor
//! can slow a guest's cores down for tens of milliseconds at a time without the guest
//! seeing it as steal: the guest's clocks say its threads ran, they just got little
//! done. Every order in flight then waits, whatever the engine does, so a latency
//! figure needs that record beside it (docs/benchmarks-history.md, 2026-12-02, 86ffe78).
//!
//! A probe thread repeats a fixed piece of work (about 50 µs) with a 2 ms sleep
//! between pieces and times each by its own thread CPU clock. Time the guest gave to
//! other threads does not count there, so a piece whose CPU time is many times the
//! fastest one's ran on a core that was itself slowed. Pieces like that less than
//! `GAP` apart form one stall. The probe costs about 2.5 % of one core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::time::{clock_gettime, ClockId};
use serde::Serialize;

/// What the probe saw.
#[derive(Debug, Serialize, PartialEq)]
pub struct HostStalls {
    /// Pieces of work timed.
    pub probes: u64,
    /// The fastest piece's thread CPU time, the reference for the others, and the
    /// median piece's, to compare between runs (within one, the median sat about
    /// 1.3 times the fastest on the hosts measured, at 300 orders/s and at 4,000).
    pub piece_us: f64,
    pub piece_p50_us: f64,
    /// Stalls: runs of slowed pieces, each less than 100 ms from the next.
    pub stalls: u64,
    /// From the start of a stall's first slowed piece to the end of its last, summed
    /// over the stalls, and the longest.
    pub stalled_ms: f64,
    pub longest_ms: f64,
    /// The slowest piece's thread CPU time over the fastest one's.
    pub worst_slowdown: f64,
    /// Each stall's start and end, in seconds since the Unix epoch, to set beside
    /// the orders' own times.
    pub windows: Vec<(f64, f64)>,
}

/// A piece counts as slowed at this many times the fastest piece's CPU time, and at
/// least `MIN_SLOW`: a guest's timer interrupt or a cache refill costs a few times a
/// piece, never the hundreds of microseconds a slowed core does.
const SLOWDOWN: f64 = 10.0;
const MIN_SLOW: Duration = Duration::from_micros(500);
/// Slowed pieces closer than this belong to one stall.
const GAP: Duration = Duration::from_millis(100);
const PAUSE: Duration = Duration::from_millis(2);
const PIECE: Duration = Duration::from_micros(50);

/// A running probe; `finish` stops it and returns what it saw.
pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Piece>>,
    /// The wall clock when the probe's `at` is zero.
    epoch: Duration,
}

/// One piece of work: when it started (since the probe started) and its thread CPU
/// time.
#[derive(Debug, Clone, Copy)]
struct Piece {
    at: Duration,
    cpu: Duration,
}

impl Probe {
    /// Starts the probe thread; None if it cannot be started.
    pub fn start() -> Option<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let started = Instant::now();
        let epoch = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
        let thread = std::thread::Builder::new()
            .name("bench-host-probe".into())
            .spawn(move || run(&flag, started))
            .ok()?;
        Some(Self {
            stop,
            thread,
            epoch,
        })
    }

    pub fn finish(self) -> Option<HostStalls> {
        self.stop.store(true, Ordering::Relaxed);
        let pieces = self.thread.join().ok()?;
        summarize(&pieces, self.epoch)
    }
}

fn thread_cpu() -> Duration {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// The work: `rounds` rounds of integer arithmetic the optimizer cannot drop.
fn work(rounds: u64) {
    let mut x = 0u64;
    for i in 0..rounds {
        x = std::hint::black_box(x.wrapping_add(i.wrapping_mul(i)));
    }
    std::hint::black_box(x);
}

fn run(stop: &AtomicBool, started: Instant) -> Vec<Piece> {
    // Size the piece to about PIECE of CPU time on this core, from the fastest of a
    // few trials (a trial may itself be slowed).
    let trial = 20_000;
    let fastest = (0..20)
        .map(|_| {
            let c = thread_cpu();
            work(trial);
            thread_cpu().saturating_sub(c)
        })
        .min()
        .unwrap_or_default()
        .max(Duration::from_nanos(1));
    let rounds = ((trial as f64) * PIECE.as_secs_f64() / fastest.as_secs_f64()).max(1.0) as u64;
    let mut pieces = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let at = started.elapsed();
        let c = thread_cpu();
        work(rounds);
        pieces.push(Piece {
            at,
            cpu: thread_cpu().saturating_sub(c),
        });
        std::thread::sleep(PAUSE);
    }
    pieces
}

/// The stalls among `pieces` (in the order they ran), `epoch` being the wall clock
/// at their zero; None without pieces.
fn summarize(pieces: &[Piece], epoch: Duration) -> Option<HostStalls> {
    let mut cpu: Vec<Duration> = pieces.iter().map(|p| p.cpu).collect();
    let slowest = *cpu.iter().max()?;
    let fastest = (*cpu.iter().min()?).max(Duration::from_nanos(1));
    let mid = cpu.len() / 2;
    let (_, &mut median, _) = cpu.select_nth_unstable(mid);
    let threshold = fastest.mul_f64(SLOWDOWN).max(MIN_SLOW);
    let mut stalls: Vec<(Duration, Duration)> = Vec::new();
    for p in pieces.iter().filter(|p| p.cpu >= threshold) {
        let end = p.at + p.cpu;
        match stalls.last_mut() {
            Some((_, last_end)) if p.at <= *last_end + GAP => *last_end = end,
            _ => stalls.push((p.at, end)),
        }
    }
    let lengths = stalls.iter().map(|(start, end)| end.saturating_sub(*start));
    Some(HostStalls {
        probes: pieces.len() as u64,
        piece_us: fastest.as_secs_f64() * 1e6,
        piece_p50_us: median.as_secs_f64() * 1e6,
        stalls: stalls.len() as u64,
        // A float sum of nothing is -0.0.
        stalled_ms: lengths
            .clone()
            .map(|d| d.as_secs_f64() * 1e3)
            .fold(0.0, |a, b| a + b),
        longest_ms: lengths.map(|d| d.as_secs_f64() * 1e3).fold(0.0, f64::max),
        worst_slowdown: slowest.as_secs_f64() / fastest.as_secs_f64(),
        windows: stalls
            .iter()
            .map(|(start, end)| ((epoch + *start).as_secs_f64(), (epoch + *end).as_secs_f64()))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(at_ms: u64, cpu_us: u64) -> Piece {
        Piece {
            at: Duration::from_millis(at_ms),
            cpu: Duration::from_micros(cpu_us),
        }
    }

    fn assert_windows(s: &HostStalls, want: &[(f64, f64)]) {
        assert_eq!(s.windows.len(), want.len(), "{s:?}");
        for (got, want) in s.windows.iter().zip(want) {
            assert!(
                (got.0 - want.0).abs() < 1e-9 && (got.1 - want.1).abs() < 1e-9,
                "{s:?}"
            );
        }
    }

    #[test]
    fn slowed_pieces_close_together_make_one_stall() {
        let mut pieces: Vec<Piece> = (0..100).map(|i| piece(i * 2, 50)).collect();
        // One stall from 40 ms to 62 ms + 4 ms (three slowed pieces), another
        // at 180 ms (one piece); a piece at 3x is noise, not a stall.
        pieces[20] = piece(40, 3_000);
        pieces[25] = piece(50, 5_000);
        pieces[31] = piece(62, 4_000);
        pieces[60] = piece(120, 150);
        pieces[90] = piece(180, 1_000);
        let s = summarize(&pieces, Duration::ZERO).expect("pieces");
        assert_eq!(s.probes, 100);
        assert_eq!(s.stalls, 2);
        assert!((s.longest_ms - 26.0).abs() < 1e-9, "{s:?}");
        assert!((s.stalled_ms - 27.0).abs() < 1e-9, "{s:?}");
        assert!((s.worst_slowdown - 100.0).abs() < 1e-9, "{s:?}");
        assert!((s.piece_us - 50.0).abs() < 1e-9, "{s:?}");
        assert!((s.piece_p50_us - 50.0).abs() < 1e-9, "{s:?}");
        assert_windows(&s, &[(0.040, 0.066), (0.180, 0.181)]);
    }

    #[test]
    fn pieces_further_apart_than_the_gap_are_separate_stalls() {
        let pieces = [piece(0, 50), piece(10, 2_000), piece(200, 2_000)];
        let s = summarize(&pieces, Duration::from_secs(1_000)).expect("pieces");
        assert_windows(&s, &[(1_000.010, 1_000.012), (1_000.2, 1_000.202)]);
        assert_eq!(s.stalls, 2);
        assert!((s.stalled_ms - 4.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn a_steady_core_shows_no_stall() {
        let pieces: Vec<Piece> = (0..50).map(|i| piece(i * 2, 50 + i % 7)).collect();
        let s = summarize(&pieces, Duration::ZERO).expect("pieces");
        assert!((s.piece_p50_us - 53.0).abs() < 1e-9, "{s:?}");
        assert_eq!(s.stalls, 0);
        assert!(
            s.stalled_ms.is_sign_positive() && s.stalled_ms == 0.0,
            "{s:?}"
        );
        assert!(summarize(&[], Duration::ZERO).is_none());
    }
}
