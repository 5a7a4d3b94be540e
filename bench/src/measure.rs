//! Measuring: percentiles, and the interleaved schedule every comparison
//! uses.
//!
//! A comparison runs its arms in rounds: every round runs one small batch of
//! each arm, the arms in a fresh random order. No arm always goes first and
//! every arm sees the same machine load (other processes, CPU frequency, the
//! gateway's caches) over the run, so their ratio says what the arms cost.

use std::time::{Duration, Instant};

use openshell_sdk::{CallOptions, Client, ExecRequest};
use rand::seq::SliceRandom;

/// The arm to run at each step: `rounds` rounds of `0..arms`, each round
/// shuffled.
pub fn interleaved(arms: usize, rounds: usize) -> Vec<usize> {
    let mut rng = rand::rng();
    let mut order = Vec::with_capacity(arms * rounds);
    for _ in 0..rounds {
        let mut round: Vec<usize> = (0..arms).collect();
        round.shuffle(&mut rng);
        order.extend(round);
    }
    order
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

pub fn percentile_or_zero(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        Duration::ZERO
    } else {
        percentile(sorted, p)
    }
}

pub fn sorted(mut samples: Vec<Duration>) -> Vec<Duration> {
    samples.sort();
    samples
}

pub fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len().max(1) as u32
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `p50 x ms, p99 y ms` of sorted samples.
pub fn p50_p99(sorted: &[Duration]) -> String {
    format!(
        "p50 {:.3} ms, p99 {:.3} ms",
        ms(percentile(sorted, 0.50)),
        ms(percentile(sorted, 0.99))
    )
}

/// Round trips of `true` execs through the SDK, in call order.
pub async fn exec_round_trips(client: &Client, sandbox: &str, rounds: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let out = client
            .exec(ExecRequest::new(sandbox, ["true"]), CallOptions::new())
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        latencies.push(started.elapsed());
    }
    latencies
}

/// utime + stime of a process, in seconds (0 once it is gone).
pub fn cpu_seconds(pid: i32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may contain spaces).
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap_or(0.0) + fields[12].parse().unwrap_or(0.0);
    // USER_HZ is 100 on Linux.
    ticks / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_runs_every_arm_once() {
        let order = interleaved(3, 50);
        assert_eq!(order.len(), 150);
        for round in order.chunks(3) {
            let mut arms = round.to_vec();
            arms.sort();
            assert_eq!(arms, [0, 1, 2]);
        }
        // 50 shuffled rounds of three all in one order: about 1 in 6^49.
        assert!(order.chunks(3).any(|round| round != order[..3].to_vec()));
    }
}
