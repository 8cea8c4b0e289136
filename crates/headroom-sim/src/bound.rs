//! The lower bound on any schedule's makespan, so every policy is judged against what is
//! possible and not only against the other policies.

use serde::Serialize;

use crate::machine::Machine;
use crate::workload::Workload;

/// No schedule of the workload on the machine can finish sooner than `seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LowerBound {
    /// The largest of the three bounds below.
    pub seconds: f64,
    /// Core-seconds of all jobs over the machine's cores.
    pub cpu: f64,
    /// Byte-seconds of all jobs' memory over the machine's memory.
    pub memory: f64,
    /// The longest chain of dependent jobs.
    pub critical_path: f64,
}

impl LowerBound {
    pub fn new(workload: &Workload, machine: Machine) -> Self {
        let cpu = workload
            .jobs
            .iter()
            .map(|job| job.core_seconds())
            .sum::<f64>()
            / machine.cores as f64;
        let memory = workload
            .jobs
            .iter()
            .map(|job| job.memory_area())
            .sum::<f64>()
            / machine.memory as f64;
        // Dependencies point to earlier jobs, so one pass in offer order finds every chain.
        let mut finish = vec![0.0f64; workload.jobs.len()];
        for (index, job) in workload.jobs.iter().enumerate() {
            let ready = job.deps.iter().map(|&dep| finish[dep]).fold(0.0, f64::max);
            finish[index] = ready + job.duration;
        }
        let critical_path = finish.iter().copied().fold(0.0, f64::max);
        LowerBound {
            seconds: cpu.max(memory).max(critical_path),
            cpu,
            memory,
            critical_path,
        }
    }
}
