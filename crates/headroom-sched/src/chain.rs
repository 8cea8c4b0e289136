//! Which jobs hold the rest of a build up. A compile whose object an hour-long link needs
//! should start before a longer compile that nothing waits for, or the link ends the build
//! alone. The governor sees no dependency graph, but the last build's jobs name their files:
//! a link's inputs are the outputs of compiles. Their durations and those links give each job
//! the longest chain of work that waited on it.
//!
//! The same chains set each job's CPU priority: when jobs want more cores than the machine
//! has, the kernel shares the cores by niceness, so jobs off the longest path start nicer and
//! leave the cores to the jobs the build waits on.

/// One job of a finished build: how long it ran and which jobs of that build (by index) made
/// the files it read.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub seconds: f64,
    pub inputs: Vec<usize>,
}

/// For each job, the seconds of the longest chain of jobs that waited on it (its own running
/// time not included): 0 for a job nothing waited on. A cycle, which a build cannot have but
/// a hand-edited history might, is cut where it closes.
pub fn waiting_seconds(jobs: &[Finished]) -> Vec<f64> {
    let mut waiting_on: Vec<Vec<usize>> = vec![Vec::new(); jobs.len()];
    for (job, finished) in jobs.iter().enumerate() {
        for &input in finished.inputs.iter().filter(|&&input| input < jobs.len()) {
            waiting_on[input].push(job);
        }
    }
    let mut memo: Vec<Option<f64>> = vec![None; jobs.len()];
    let mut visiting = vec![false; jobs.len()];
    (0..jobs.len())
        .map(|job| longest_after(job, jobs, &waiting_on, &mut memo, &mut visiting))
        .collect()
}

fn longest_after(
    job: usize,
    jobs: &[Finished],
    waiting_on: &[Vec<usize>],
    memo: &mut [Option<f64>],
    visiting: &mut [bool],
) -> f64 {
    if let Some(seconds) = memo[job] {
        return seconds;
    }
    if visiting[job] {
        return 0.0;
    }
    visiting[job] = true;
    let mut longest = 0.0_f64;
    for &next in &waiting_on[job] {
        let chain = jobs[next].seconds + longest_after(next, jobs, waiting_on, memo, visiting);
        longest = longest.max(chain);
    }
    visiting[job] = false;
    memo[job] = Some(longest);
    longest
}

/// The nicest a job is started at, as `nice(1)` counts (0 is the normal priority).
pub const LOWEST_PRIORITY: u8 = 19;

/// The niceness to start a job at whose longest path (its own seconds and the work that
/// waited on it) is `path_seconds`, when the longest path of any job queued or running is
/// `longest_seconds`: 0 on the longest path, nicer the shorter the job's path, up to
/// [`LOWEST_PRIORITY`]. A job whose path is unknown (0 seconds) keeps the normal priority.
pub fn niceness(path_seconds: f64, longest_seconds: f64) -> u8 {
    if path_seconds <= 0.0 || path_seconds >= longest_seconds {
        return 0;
    }
    let off_the_path = 1.0 - path_seconds / longest_seconds;
    (f64::from(LOWEST_PRIORITY) * off_the_path).round() as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(seconds: f64, inputs: &[usize]) -> Finished {
        Finished {
            seconds,
            inputs: inputs.to_vec(),
        }
    }

    #[test]
    fn each_job_carries_the_longest_chain_that_read_its_output() {
        let jobs = [
            job(10.0, &[]),      // a.o
            job(30.0, &[]),      // b.o
            job(20.0, &[]),      // c.o
            job(100.0, &[0, 1]), // tool: a.o b.o
            job(5.0, &[1, 2]),   // lib.so: b.o c.o
            job(1.0, &[3]),      // package: tool
        ];
        assert_eq!(
            waiting_seconds(&jobs),
            vec![101.0, 101.0, 5.0, 1.0, 0.0, 0.0]
        );
    }

    #[test]
    fn jobs_off_the_longest_path_start_nicer() {
        assert_eq!(niceness(100.0, 100.0), 0);
        assert_eq!(niceness(95.0, 100.0), 1);
        assert_eq!(niceness(50.0, 100.0), 10);
        assert_eq!(niceness(1.0, 100.0), 19);
        // Unknown paths keep the normal priority, and so does everything when none is known.
        assert_eq!(niceness(0.0, 100.0), 0);
        assert_eq!(niceness(0.0, 0.0), 0);
    }

    #[test]
    fn a_cycle_ends_instead_of_looping() {
        let jobs = [job(1.0, &[1]), job(2.0, &[0]), job(3.0, &[7])];
        let waiting = waiting_seconds(&jobs);
        assert!(waiting.iter().all(|seconds| seconds.is_finite()));
        assert_eq!(waiting[2], 0.0);
    }
}
