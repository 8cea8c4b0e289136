//! The lower bound on any schedule's makespan, so every policy is judged against what is
//! possible and not only against the other policies.

use headroom_sched::chain::{self, Finished};
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
    /// The first two bounds for the jobs one job waits for, then the chain from that job on,
    /// for the job where this is longest: a link that reads every object starts no sooner
    /// than all compiles fit on the machine, then runs alone.
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
        let finished: Vec<Finished> = workload
            .jobs
            .iter()
            .map(|job| Finished {
                seconds: job.duration,
                inputs: job.deps.clone(),
            })
            .collect();
        // Each job's own seconds and the longest chain that waits on it.
        let chains: Vec<f64> = chain::waiting_seconds(&finished)
            .into_iter()
            .zip(&workload.jobs)
            .map(|(waiting, job)| job.duration + waiting)
            .collect();
        let critical_path = chains.iter().copied().fold(0.0, f64::max);
        let prerequisites_then_chain = prerequisites(workload)
            .into_iter()
            .zip(&chains)
            .map(|(before, chain)| {
                let wait = (before.core_seconds / cores).max(before.byte_seconds / memory_bytes);
                wait + chain
            })
            .fold(0.0, f64::max);
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

/// The work of every job that one job waits for, directly or through others.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Work {
    core_seconds: f64,
    byte_seconds: f64,
}

/// For each job, the work of all its prerequisites. Dependencies point to earlier jobs, so one
/// pass in offer order gathers each job's prerequisites (as a bit set over the jobs) from those
/// of its direct ones.
fn prerequisites(workload: &Workload) -> Vec<Work> {
    let jobs = &workload.jobs;
    let words = jobs.len().div_ceil(64);
    let mut sets: Vec<Vec<u64>> = Vec::with_capacity(jobs.len());
    for job in jobs {
        let mut set = vec![0u64; words];
        for &dep in &job.deps {
            for (word, dep_word) in set.iter_mut().zip(&sets[dep]) {
                *word |= dep_word;
            }
            set[dep / 64] |= 1 << (dep % 64);
        }
        sets.push(set);
    }
    sets.iter()
        .map(|set| {
            let members = (0..jobs.len()).filter(|&job| set[job / 64] & (1 << (job % 64)) != 0);
            members.fold(Work::default(), |work, job| Work {
                core_seconds: work.core_seconds + jobs[job].core_seconds(),
                byte_seconds: work.byte_seconds + jobs[job].memory_area(),
            })
        })
        .collect()
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

    #[test]
    fn a_link_of_every_object_waits_for_all_compiles_to_fit_on_the_cores() {
        // Eight 10 s compiles on 4 cores take 20 s at best; the 5 s link that reads them all
        // runs after them: 25 s, above the work over the cores (21.25 s) and the chain (15 s).
        let mut jobs: Vec<TraceJob> = (0..8)
            .map(|index| job(&format!("u{index}.o"), Vec::new(), 10.0))
            .collect();
        jobs.push(job("a.out", (0..8).collect(), 5.0));
        let trace = Trace {
            schema: SCHEMA,
            name: "link".into(),
            source: None,
            recorded: None,
            jobs,
        };
        let config = SimConfig {
            variation: 0.0,
            ..SimConfig::default()
        };
        let bound = LowerBound::new(&Workload::new(&trace, &config), "4c/64G".parse().unwrap());
        assert!((bound.cpu - 21.25).abs() < 1e-9, "{bound:?}");
        assert!((bound.critical_path - 15.0).abs() < 1e-9, "{bound:?}");
        assert!(
            (bound.prerequisites_then_chain - 25.0).abs() < 1e-9,
            "{bound:?}"
        );
        assert_eq!(bound.seconds, bound.prerequisites_then_chain);
    }

    #[test]
    fn prerequisites_include_the_jobs_of_jobs_waited_for() {
        let trace = Trace {
            schema: SCHEMA,
            name: "chain".into(),
            source: None,
            recorded: None,
            jobs: vec![
                job("a", Vec::new(), 1.0),
                job("b", vec![0], 2.0),
                job("c", Vec::new(), 4.0),
                job("d", vec![1], 8.0),
            ],
        };
        let workload = Workload::new(&trace, &SimConfig::default());
        let seconds: Vec<f64> = prerequisites(&workload)
            .iter()
            .map(|work| work.core_seconds)
            .collect();
        let own = |job: usize| workload.jobs[job].core_seconds();
        assert_eq!(seconds, vec![0.0, own(0), 0.0, own(0) + own(1)]);
    }
}
