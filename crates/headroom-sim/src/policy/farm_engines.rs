//! The distributed compile engines on their own, placing compiles on a farm the way they do
//! today, with no knowledge of what a job will need: sccache-dist by cores, icecream by load.
//! Both compile here a job whose remote compile failed, so a node that runs out of memory
//! hands the job, at its full size, to this machine. The build runs at `-j` the farm's
//! slots, as users set it for a farm; links and other jobs that are not compiles run here,
//! as the engines distribute only compiles.

use std::collections::{HashMap, HashSet};

use headroom_sched::{Action, JobId, NodeId};

use super::baselines::{BuildQueue, Order};
use crate::engine::{NodeLoad, Policy, View};
use crate::machine::FarmSpec;
use crate::trace::JobKind;
use crate::workload::SimJob;

/// A distributed compile engine, by how its scheduler picks a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// sccache-dist: its scheduler gives a job to the server with the fewest jobs per core,
    /// while one has fewer jobs than cores, and memory plays no part (mozilla/sccache#708:
    /// jobs are assigned by the cores each server has). A compile that fails on the server is
    /// compiled locally by the client.
    SccacheDist,
    /// icecream: its scheduler gives a job to the node of lowest load, which each node's
    /// daemon reports as the larger of its busy CPU and its memory fill grade, 0 until less
    /// than 128 MiB is free: memory already in use, not what the job will need. A job that
    /// fails remotely is recompiled locally (icecc/icecream#49, #483). The loads here are
    /// exact at each decision, where the daemons report every few seconds: more than the real
    /// scheduler knows.
    Icecream,
}

/// Free memory below which an icecream daemon counts its memory as filling up.
const ICECREAM_LOW_MEMORY: u64 = 128 << 20;
/// The load (of 1000) at which icecream's scheduler gives a node nothing more.
const ICECREAM_FULL_LOAD: u64 = 1000;

impl Engine {
    /// How users name it.
    pub fn name(self) -> &'static str {
        match self {
            Engine::SccacheDist => "sccache-dist",
            Engine::Icecream => "icecream",
        }
    }

    /// The node the engine's scheduler gives the next job, or `None` when no node takes one.
    fn pick(self, nodes: &[NodeLoad]) -> Option<NodeId> {
        let open = nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.jobs < node.spec.cores);
        match self {
            Engine::SccacheDist => open
                .min_by(|(_, a), (_, b)| jobs_per_core(a).total_cmp(&jobs_per_core(b)))
                .map(|(id, _)| id),
            Engine::Icecream => open
                .map(|(id, node)| (id, icecream_load(node), node.jobs))
                .filter(|&(_, load, _)| load < ICECREAM_FULL_LOAD)
                .min_by_key(|&(_, load, jobs)| (load, jobs))
                .map(|(id, _, _)| id),
        }
    }
}

fn jobs_per_core(node: &NodeLoad) -> f64 {
    node.jobs as f64 / node.spec.cores as f64
}

/// What an icecream daemon reports as its load, of 1000: the larger of its busy CPU and its
/// memory fill grade.
fn icecream_load(node: &NodeLoad) -> u64 {
    let busy = (node.threads / node.spec.cores as f64).min(1.0);
    let free = node.spec.memory.saturating_sub(node.used);
    let memory = ICECREAM_FULL_LOAD
        - ICECREAM_FULL_LOAD * free.min(ICECREAM_LOW_MEMORY) / ICECREAM_LOW_MEMORY;
    ((busy * ICECREAM_FULL_LOAD as f64) as u64).max(memory)
}

/// A build at `-j` the farm's slots whose compiles `engine` places on the farm.
pub struct FarmEngine {
    engine: Engine,
    jobs: usize,
    queue: BuildQueue,
    /// Where each running job was sent (`None`: here).
    placed: HashMap<JobId, Option<NodeId>>,
    /// Jobs whose remote compile failed: the engine's client compiles them here next.
    fallback: HashSet<JobId>,
}

impl FarmEngine {
    pub fn new(engine: Engine, farm: FarmSpec) -> Self {
        FarmEngine {
            engine,
            jobs: farm.slots(),
            queue: BuildQueue::default(),
            placed: HashMap::new(),
            fallback: HashSet::new(),
        }
    }
}

impl Policy for FarmEngine {
    fn name(&self) -> String {
        format!("{} -j{}", self.engine.name(), self.jobs)
    }

    fn family(&self) -> &'static str {
        self.engine.name()
    }

    fn needs_ticks(&self) -> bool {
        false
    }

    fn offer(&mut self, job: &SimJob) {
        self.queue.offer(job, 0);
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        let mut nodes = view.nodes.to_vec();
        let mut count = view.running.len();
        let mut placed = Vec::new();
        let actions = self
            .queue
            .start_while(view.running, Order::Strict, |candidate| {
                if count >= self.jobs {
                    return false;
                }
                let here =
                    candidate.kind != JobKind::Compile || self.fallback.contains(&candidate.id);
                let node = if here {
                    None
                } else {
                    let Some(node) = self.engine.pick(&nodes) else {
                        return false;
                    };
                    nodes[node].jobs += 1;
                    nodes[node].threads += candidate.threads;
                    Some(node)
                };
                count += 1;
                placed.push((candidate.id, node));
                true
            });
        for (id, node) in placed {
            self.fallback.remove(&id);
            self.placed.insert(id, node);
        }
        actions
    }

    fn node_of(&self, id: JobId) -> Option<NodeId> {
        self.placed.get(&id).copied().flatten()
    }

    fn finished(&mut self, job: &SimJob, _peak: u64, _now: f64) {
        self.placed.remove(&job.id);
        self.queue.finished(job.id);
    }

    fn oom_killed(&mut self, job: &SimJob, _peak: u64) {
        match self.placed.remove(&job.id).flatten() {
            // The remote compile failed: the client compiles it here at once.
            Some(_) => {
                self.fallback.insert(job.id);
                self.queue.retry(job.id);
            }
            // This machine's kernel killed it: the build failed and is rerun.
            None => self.queue.oom_killed(job.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Machine;

    const GIB: u64 = 1 << 30;

    fn node(jobs: usize, used: u64) -> NodeLoad {
        NodeLoad {
            spec: Machine {
                cores: 4,
                memory: 8 * GIB,
            },
            jobs,
            threads: jobs as f64,
            used,
        }
    }

    #[test]
    fn sccache_dist_picks_the_fewest_jobs_per_core_whatever_their_memory() {
        let nodes = [node(2, 7 * GIB), node(3, GIB), node(4, 0)];
        assert_eq!(Engine::SccacheDist.pick(&nodes), Some(0));
        assert_eq!(Engine::SccacheDist.pick(&[node(4, 0)]), None, "cores full");
    }

    #[test]
    fn icecream_sees_memory_only_once_it_is_nearly_gone() {
        let nearly_full = 8 * GIB - (64 << 20);
        let nodes = [node(1, nearly_full), node(2, 0), node(1, 7 * GIB)];
        assert_eq!(icecream_load(&nodes[0]), 500);
        assert_eq!(
            icecream_load(&nodes[2]),
            250,
            "7 of 8 GiB used counts as free"
        );
        assert_eq!(Engine::Icecream.pick(&nodes), Some(2));
        assert_eq!(Engine::Icecream.pick(&[node(1, 8 * GIB)]), None);
    }
}
