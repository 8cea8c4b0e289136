//! Placement on a build farm: which node of a distributed compile engine a job goes to, so
//! that no node is ever planned more predicted memory than it has. Engines place by cores
//! (sccache-dist) or by load (icecream); only headroom knows what each job will need.
//! Pure bookkeeping, like the rest of the policy: the governor and the simulator both use it.

use headroom_size::format_size;

/// One node, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// What the engine calls it (`host:port` for distcc), and the report shows.
    pub name: String,
    /// The memory its compiles may use in all.
    pub memory: u64,
    /// How many compiles it runs at once.
    pub slots: usize,
}

/// Index of a node in the farm's list.
pub type NodeId = usize;

#[derive(Debug, Clone)]
struct Node {
    spec: NodeSpec,
    /// The predicted memory of the jobs placed on it now.
    planned: u64,
    running: usize,
    /// False once the engine could not reach it: nothing more is placed there this build.
    up: bool,
}

/// The farm's nodes and what is placed on each now.
#[derive(Debug, Clone)]
pub struct Farm {
    nodes: Vec<Node>,
}

impl Farm {
    pub fn new(specs: Vec<NodeSpec>) -> Farm {
        Farm {
            nodes: specs
                .into_iter()
                .map(|spec| Node {
                    spec,
                    planned: 0,
                    running: 0,
                    up: true,
                })
                .collect(),
        }
    }

    pub fn spec(&self, node: NodeId) -> &NodeSpec {
        &self.nodes[node].spec
    }

    pub fn specs(&self) -> impl Iterator<Item = &NodeSpec> {
        self.nodes.iter().map(|node| &node.spec)
    }

    /// Places a job that needs `need` bytes: on the node that is up, has a free slot and room
    /// for `need` beside what is planned there, and is least busy (the smallest part of its
    /// slots in use), so work spreads over the farm's cores; of those, the one it fits
    /// most tightly. `None` when no node can take it now.
    pub fn place(&mut self, need: u64) -> Option<NodeId> {
        let chosen = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| {
                node.up
                    && node.running < node.spec.slots
                    && node.planned.saturating_add(need) <= node.spec.memory
            })
            .min_by(|(_, a), (_, b)| {
                let busy = |node: &Node| node.running as f64 / node.spec.slots as f64;
                // Then the tightest fit: larger nodes stay free for larger jobs.
                busy(a)
                    .total_cmp(&busy(b))
                    .then((a.spec.memory - a.planned).cmp(&(b.spec.memory - b.planned)))
            })
            .map(|(id, _)| id)?;
        let node = &mut self.nodes[chosen];
        node.planned += need;
        node.running += 1;
        tracing::debug!(
            "placed {} on {} ({} of {} planned, {}/{} slots)",
            format_size(need),
            node.spec.name,
            format_size(node.planned),
            format_size(node.spec.memory),
            node.running,
            node.spec.slots
        );
        Some(chosen)
    }

    /// A job placed with `need` on `node` is no longer there. Returns the room it had there
    /// at most: the node's memory less what the other jobs there were planned to use. A job
    /// that ran out of memory there needs more.
    pub fn release(&mut self, node: NodeId, need: u64) -> u64 {
        let node = &mut self.nodes[node];
        let others = node.planned.saturating_sub(need);
        node.planned = others;
        node.running = node.running.saturating_sub(1);
        node.spec.memory - others
    }

    /// The engine could not reach `node`: nothing more goes there in this build.
    pub fn mark_down(&mut self, node: NodeId) {
        let node = &mut self.nodes[node];
        if node.up {
            tracing::warn!(
                "farm node {} is unreachable: its jobs run elsewhere",
                node.spec.name
            );
        }
        node.up = false;
    }

    pub fn is_up(&self, node: NodeId) -> bool {
        self.nodes[node].up
    }

    /// Whether some node that is up could take `need` bytes once it is empty.
    pub fn could_fit(&self, need: u64) -> bool {
        self.nodes
            .iter()
            .any(|node| node.up && node.spec.memory >= need)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn farm(nodes: &[(u64, usize)]) -> Farm {
        Farm::new(
            nodes
                .iter()
                .enumerate()
                .map(|(i, &(memory, slots))| NodeSpec {
                    name: format!("node{i}"),
                    memory,
                    slots,
                })
                .collect(),
        )
    }

    #[test]
    fn never_plans_more_memory_onto_a_node_than_it_has() {
        let mut farm = farm(&[(3 * GIB, 4), (3 * GIB, 4)]);
        assert_eq!(farm.place(2 * GIB), Some(0));
        assert_eq!(farm.place(2 * GIB), Some(1));
        assert_eq!(farm.place(2 * GIB), None, "1 GiB is left on each node");
        assert_eq!(farm.place(GIB), Some(0));
        farm.release(1, 2 * GIB);
        assert_eq!(farm.place(2 * GIB), Some(1));
    }

    #[test]
    fn spreads_jobs_by_slots_and_keeps_to_them() {
        let mut farm = farm(&[(64 * GIB, 2), (64 * GIB, 4)]);
        let placed: Vec<_> = (0..6).map(|_| farm.place(GIB).unwrap()).collect();
        assert_eq!(placed.iter().filter(|&&n| n == 0).count(), 2);
        assert_eq!(placed.iter().filter(|&&n| n == 1).count(), 4);
        assert_eq!(farm.place(GIB), None, "every slot is taken");
    }

    #[test]
    fn a_node_that_is_down_takes_nothing_more() {
        let mut farm = farm(&[(8 * GIB, 2), (4 * GIB, 2)]);
        farm.mark_down(0);
        assert_eq!(farm.place(GIB), Some(1));
        assert!(!farm.could_fit(5 * GIB));
        assert!(farm.could_fit(4 * GIB));
    }

    #[test]
    fn the_room_a_job_had_leaves_out_the_other_jobs_on_the_node() {
        let mut farm = farm(&[(4 * GIB, 2)]);
        farm.place(GIB).unwrap();
        farm.place(GIB).unwrap();
        assert_eq!(farm.release(0, GIB), 3 * GIB);
        assert_eq!(farm.release(0, GIB), 4 * GIB);
    }
}
