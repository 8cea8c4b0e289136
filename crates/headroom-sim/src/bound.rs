//! The lower bound on any schedule's makespan, so every policy is judged against what is
//! possible and not only against the other policies.

use serde::Serialize;

use crate::machine::Machine;
use crate::workload::Workload;

/// No schedule of the workload on the machine can finish sooner than `seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LowerBound {
    /// The largest of the bounds below.
    pub seconds: f64,
    /// Core-seconds of all jobs over the machine's cores.
    pub cpu: f64,
    /// Byte-seconds of all jobs' memory over the machine's memory.
    pub memory: f64,
    /// The longest chain of dependent jobs.
    pub critical_path: f64,
    /// For the jobs with the longest chains from them on (the k longest, for the k where
    /// this is largest), the first two bounds for everything they wait for, then the shortest
    /// of their chains: the last of them to start waits for all of it. A link that reads every
    /// object starts no sooner than all compiles fit on the machine, then runs alone.
    pub prerequisites_then_chain: f64,
}

impl LowerBound {
    pub fn new(workload: &Workload, machine: Machine) -> Self {
        let cores = machine.cores as f64;
        let memory_bytes = machine.memory as f64;
        let cpu = workload
            .jobs
            .iter()
            .map(|job| job.core_seconds())
            .sum::<f64>()
            / cores;
        let memory = workload
            .jobs
            .iter()
            .map(|job| job.memory_area())
            .sum::<f64>()
            / memory_bytes;
        let chains = workload.chains();
        let critical_path = chains.iter().copied().fold(0.0, f64::max);
        let prerequisites_then_chain = prerequisites_then_chain(workload, machine, &chains);
        LowerBound {
            seconds: cpu
                .max(memory)
                .max(critical_path)
                .max(prerequisites_then_chain),
            cpu,
            memory,
            critical_path,
            prerequisites_then_chain,
        }
    }
}

/// The jobs with the longest `chains` from them on, k at a time for every k: the last of them
/// to start does so only once everything any of them waits for has run, which takes at least
/// its core-seconds over the cores (or its byte-seconds over the memory), and then runs at
/// least the shortest of their chains. The largest such bound over k.
fn prerequisites_then_chain(workload: &Workload, machine: Machine, chains: &[f64]) -> f64 {
    let jobs = &workload.jobs;
    let mut longest_first: Vec<usize> = (0..jobs.len()).collect();
    longest_first.sort_by(|&a, &b| chains[b].total_cmp(&chains[a]));
    // What the jobs taken so far wait for. It holds every prerequisite of each job in it, so
    // a walk from a new job's dependencies stops at jobs already in it: each job is added
    // once, and the whole sweep is linear in jobs and dependencies.
    let mut waited_for = vec![false; jobs.len()];
    let (mut core_seconds, mut byte_seconds) = (0.0, 0.0);
    let mut to_visit = Vec::new();
    let mut bound = 0.0f64;
    for job in longest_first {
        to_visit.extend_from_slice(&jobs[job].deps);
        while let Some(other) = to_visit.pop() {
            if std::mem::replace(&mut waited_for[other], true) {
                continue;
            }
            core_seconds += jobs[other].core_seconds();
            byte_seconds += jobs[other].memory_area();
            to_visit.extend_from_slice(&jobs[other].deps);
        }
        let wait = (core_seconds / machine.cores as f64).max(byte_seconds / machine.memory as f64);
        bound = bound.max(wait + chains[job]);
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{JobKind, Trace, TraceJob, SCHEMA};
    use crate::SimConfig;

    const GIB: u64 = 1 << 30;

    fn job(label: &str, deps: Vec<usize>, duration: f64) -> TraceJob {
        TraceJob {
            label: label.into(),
            group: "cc".into(),
            kind: JobKind::Compile,
            deps,
            peak: GIB,
            duration,
            cpu: duration,
            profile: Vec::new(),
            input_bytes: None,
        }
    }

    /// The workload of `jobs` exactly as the trace says.
    fn workload(jobs: Vec<TraceJob>) -> Workload {
        let trace = Trace {
            schema: SCHEMA,
            name: "hand-made".into(),
            source: None,
            recorded: None,
            jobs,
        };
        let exact = SimConfig {
            variation: 0.0,
            ..SimConfig::default()
        };
        Workload::new(&trace, &exact)
    }

    /// Eight independent 10 s compiles, `u0.o` to `u7.o`.
    fn eight_compiles() -> Vec<TraceJob> {
        (0..8)
            .map(|index| job(&format!("u{index}.o"), Vec::new(), 10.0))
            .collect()
    }

    #[test]
    fn a_link_of_every_object_waits_for_all_compiles_to_fit_on_the_cores() {
        // The eight compiles take 20 s at best on 4 cores; the 5 s link that reads them all
        // runs after them: 25 s, above the work over the cores (21.25 s) and the chain (15 s).
        let mut jobs = eight_compiles();
        jobs.push(job("a.out", (0..8).collect(), 5.0));
        let bound = LowerBound::new(&workload(jobs), "4c/64G".parse().unwrap());
        assert!((bound.cpu - 21.25).abs() < 1e-9, "{bound:?}");
        assert!((bound.critical_path - 15.0).abs() < 1e-9, "{bound:?}");
        assert!(
            (bound.prerequisites_then_chain - 25.0).abs() < 1e-9,
            "{bound:?}"
        );
        assert_eq!(bound.seconds, bound.prerequisites_then_chain);
    }

    #[test]
    fn two_links_of_overlapping_objects_wait_for_all_of_them_between_them() {
        // The eight compiles on 4 cores; a 20 s link reads units 0-5, a 19 s link units
        // 2-7. Whichever link starts last waits for all eight compiles (20 s), then runs at
        // least 19 s: 39 s, more than either link alone (35 s and 34 s).
        let mut jobs = eight_compiles();
        jobs.push(job("a", (0..6).collect(), 20.0));
        jobs.push(job("b", (2..8).collect(), 19.0));
        let bound = LowerBound::new(&workload(jobs), "4c/64G".parse().unwrap());
        assert!(
            (bound.prerequisites_then_chain - 39.0).abs() < 1e-9,
            "{bound:?}"
        );
        assert_eq!(bound.seconds, bound.prerequisites_then_chain);
    }
}
