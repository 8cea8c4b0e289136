//! Compile-worker pools sized from the budget, as `MAX_JOBS` is for builds. JIT compilers in
//! a running program start a pool of worker processes sized by the CPU count alone: torch's
//! Inductor starts up to 32 compile workers of about 370 MiB RSS each, TileLang's autotuner one
//! per CPU. headroom sets the variable each pool reads to the number of workers the budget has
//! room for, unless the user set it: then the user's value stands, and the report says so.

use serde::Serialize;

/// The variables that size a compile-worker pool, each read by one JIT compiler:
/// torch Inductor's compile workers (`torch._inductor.config.decide_compile_threads`), and the
/// compile workers of TileLang's autotuner (`tilelang.env`, used where it is above 0).
/// Triton compiles in the process that calls it (under torch, in Inductor's workers), and
/// `neuron_parallel_compile` takes its parallelism as a flag, not a variable: neither has one.
pub const POOL_VARIABLES: [&str; 2] = [
    "TORCHINDUCTOR_COMPILE_THREADS",
    "TILELANG_AUTO_TUNING_CPU_COUNTS",
];

/// What one compile worker is taken to cost when nothing better is known: an idle Inductor
/// compile worker (torch 2.15, forked from its sidecar) holds about 380 MiB of RSS, of which
/// about 100 MiB is its own (PSS); the rest of the 400 MiB is room for what it compiles.
pub const DEFAULT_WORKER_COST: u64 = 400 << 20;

/// How the compile-worker pools of one rung were sized.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolSizes {
    /// The workers the budget has room for: `budget / per_worker`, at least 1, at most `cores`.
    pub workers: usize,
    pub budget: u64,
    pub per_worker: u64,
    pub cores: usize,
    /// The variables headroom set, `(NAME, VALUE)`.
    pub set: Vec<(String, String)>,
    /// The variables the user had set, kept as they were.
    pub kept: Vec<(String, String)>,
}

/// Sizes the pools for `budget` bytes, `per_worker` bytes a worker and `cores` CPUs; `users`
/// tells the value the user gave a variable (in the environment or the rung's overrides).
pub fn size_pools(
    budget: u64,
    per_worker: u64,
    cores: usize,
    users: impl Fn(&str) -> Option<String>,
) -> PoolSizes {
    let fits = usize::try_from(budget / per_worker.max(1)).unwrap_or(usize::MAX);
    let workers = fits.clamp(1, cores.max(1));
    let (mut set, mut kept) = (Vec::new(), Vec::new());
    for name in POOL_VARIABLES {
        match users(name) {
            Some(value) => kept.push((name.to_string(), value)),
            None => set.push((name.to_string(), workers.to_string())),
        }
    }
    PoolSizes {
        workers,
        budget,
        per_worker,
        cores,
        set,
        kept,
    }
}

impl PoolSizes {
    /// One line for the table: what was set and why, and what the user's settings kept.
    pub fn describe(&self) -> String {
        let words = |pairs: &[(String, String)]| {
            pairs
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut line = String::new();
        if !self.set.is_empty() {
            line = format!(
                "set {} ({} budget / {} a worker, at most {} cores)",
                words(&self.set),
                headroom_size::format_size(self.budget),
                headroom_size::format_size(self.per_worker),
                self.cores
            );
        }
        if !self.kept.is_empty() {
            if !line.is_empty() {
                line.push_str("; ");
            }
            line.push_str(&format!("kept yours: {}", words(&self.kept)));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_what_the_budget_holds_within_the_cores() {
        let none = |_: &str| None;
        assert_eq!(size_pools(2 << 30, 400 << 20, 16, none).workers, 5);
        assert_eq!(size_pools(100 << 30, 400 << 20, 16, none).workers, 16);
        assert_eq!(size_pools(100 << 20, 400 << 20, 16, none).workers, 1);
        let sizes = size_pools(2 << 30, 400 << 20, 16, none);
        assert_eq!(
            sizes.set,
            POOL_VARIABLES.map(|name| (name.to_string(), "5".to_string()))
        );
        assert!(sizes.kept.is_empty());
    }

    #[test]
    fn a_users_own_setting_is_kept_and_said() {
        let users = |name: &str| (name == "TORCHINDUCTOR_COMPILE_THREADS").then(|| "8".to_string());
        let sizes = size_pools(2 << 30, 400 << 20, 4, users);
        assert_eq!(
            sizes.kept,
            [("TORCHINDUCTOR_COMPILE_THREADS".to_string(), "8".to_string())]
        );
        assert_eq!(
            sizes.set,
            [(
                "TILELANG_AUTO_TUNING_CPU_COUNTS".to_string(),
                "4".to_string()
            )]
        );
        assert_eq!(
            sizes.describe(),
            "set TILELANG_AUTO_TUNING_CPU_COUNTS=4 (2.00 GiB budget / 400.0 MiB a worker, at most 4 cores); kept yours: TORCHINDUCTOR_COMPILE_THREADS=8"
        );
    }
}
