//! What the governor takes from recent builds beyond each job's own history:
//!
//! - the chains of jobs that waited on each job, so the queue can start first the jobs that
//!   hold the most of the build up (`headroom_sched::chain`). A job waited on another when the
//!   other's `-o` file is among its arguments: the objects a link reads, the archive a later
//!   link reads. Jobs that name their outputs otherwise (rustc's `--out-dir`) link nothing.
//!   Each job takes its chain from the newest build that ran it, so a rebuild of one file
//!   after a full build leaves the full build's chains for every other file;
//! - how far jobs strayed in time and peak between their two newest runs, so a build plans
//!   with the timing slack and the margin on peaks this machine shows from its first job on,
//!   not only once enough of its own jobs have finished;
//! - which jobs the build system offered together (`headroom_sched::bursts`): `make -j`
//!   starts a burst of jobs at once, and whichever connects first would start before the
//!   governor has seen the longer jobs of the same burst.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use headroom_report::JobRecord;
use headroom_sched::bursts::{BurstOffer, Bursts};
use headroom_sched::chain::{waiting_seconds, Finished};
use headroom_sched::Ran;

use crate::job::JobIdentity;

/// Recent builds read at start: enough to reach past a day of rebuilds to the last full
/// build, few enough to read quickly (20 builds of 5,000 jobs: about 0.2 s).
pub const BUILDS_TO_READ: usize = 20;

/// Seconds of work that waited on each job, by job key, from `builds` (each build's jobs,
/// newest build first): each key as the newest build that ran it saw it.
pub fn waiting_seconds_by_key(builds: &[Vec<JobRecord>]) -> HashMap<String, f64> {
    let mut by_key = HashMap::new();
    for jobs in builds {
        // After repeated full builds every key is known from the newest: parsing the older
        // builds' commands again would only be thrown away.
        if jobs.iter().all(|job| by_key.contains_key(&job.key)) {
            continue;
        }
        for (key, seconds) in in_one_build(jobs) {
            by_key.entry(key).or_insert(seconds);
        }
    }
    by_key
}

/// Seconds of work that waited on each job of one build's `jobs`, by job key.
fn in_one_build(jobs: &[JobRecord]) -> Vec<(String, f64)> {
    let finished: Vec<Finished> = jobs
        .iter()
        .zip(named_inputs(jobs))
        .map(|(job, inputs)| Finished {
            seconds: job.wall_seconds(),
            inputs,
        })
        .collect();
    jobs.iter()
        .map(|job| job.key.clone())
        .zip(waiting_seconds(&finished))
        .collect()
}

/// For each of one build's `jobs`, the jobs (by index) whose `-o` file it names among its
/// arguments.
pub fn named_inputs(jobs: &[JobRecord]) -> Vec<Vec<usize>> {
    let arguments: Vec<Vec<String>> = jobs
        .iter()
        .map(|job| job.command.split_whitespace().map(String::from).collect())
        .collect();
    let mut made_by: HashMap<PathBuf, usize> = HashMap::new();
    for (index, (job, words)) in jobs.iter().zip(&arguments).enumerate() {
        let Some((compiler, args)) = words.split_first() else {
            continue;
        };
        if let Some(output) = JobIdentity::new(compiler, args, &job.cwd).output {
            made_by.insert(resolve(&job.cwd, &output), index);
        }
    }
    jobs.iter()
        .zip(&arguments)
        .enumerate()
        .map(|(index, (job, words))| {
            // Its own `-o` file is among its words too.
            let mut inputs: Vec<usize> = words
                .iter()
                .skip(1)
                .filter_map(|word| made_by.get(&resolve(&job.cwd, word)).copied())
                .filter(|&maker| maker != index)
                .collect();
            inputs.sort_unstable();
            inputs.dedup();
            inputs
        })
        .collect()
}

/// The bursts of `newest` (one build's jobs), with paths from `waiting_seconds` by key.
pub fn bursts(newest: &[JobRecord], waiting_seconds: &HashMap<String, f64>) -> Bursts {
    Bursts::new(newest.iter().map(|job| BurstOffer {
        key: job.key.clone(),
        offered_ms: job.offered_ms,
        end_ms: job.end_ms,
        path: job.wall_seconds() + waiting_seconds.get(&job.key).copied().unwrap_or(0.0),
    }))
}

/// A run that succeeded at its first attempt and was never stopped, so its wall time is all
/// running time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CleanRun {
    pub ran: Ran,
    pub peak: u64,
}

/// Each job's two newest clean runs among `builds` (each build's jobs, newest build first) as
/// `(earlier run, later run)`, oldest later run first.
pub fn reruns(builds: &[Vec<JobRecord>]) -> Vec<(CleanRun, CleanRun)> {
    let clean = |job: &JobRecord| {
        let ran = Ran {
            cpu_seconds: job.cpu_ms as f64 / 1000.0,
            wall_seconds: job.wall_seconds(),
        };
        let once = job.attempts <= 1 && job.suspends == 0 && job.requeues == 0;
        // A farm node compiled it: its peak here is distcc's client, and its time the node's.
        let here = job.node.is_none();
        (job.exit_code == Some(0) && once && here).then_some(CleanRun {
            ran,
            peak: job.peak,
        })
    };
    // The newest clean run of each key, and the keys already paired with an older run.
    let mut newest: HashMap<&str, (usize, u64, CleanRun)> = HashMap::new();
    let mut paired: HashSet<&str> = HashSet::new();
    let mut pairs = Vec::new();
    for (build, jobs) in builds.iter().enumerate() {
        for job in jobs {
            let key = job.key.as_str();
            let Some(ran) = clean(job).filter(|_| !paired.contains(key)) else {
                continue;
            };
            match newest.get(key) {
                None => {
                    newest.insert(key, (build, job.end_ms, ran));
                }
                Some(&(later_build, end_ms, later)) if later_build < build => {
                    pairs.push((later_build, end_ms, ran, later));
                    paired.insert(key);
                }
                // The same build ran the key twice.
                Some(_) => {}
            }
        }
    }
    // Oldest later run first: older builds first, then by when the run ended.
    pairs.sort_by_key(|&(build, end_ms, _, _)| (std::cmp::Reverse(build), end_ms));
    pairs
        .into_iter()
        .map(|(_, _, earlier, later)| (earlier, later))
        .collect()
}

/// `path` as a job running in `cwd` names it, with `.` and `..` parts taken out by the text
/// alone, so that `../obj/a.o` from `bin/` and `obj/a.o` from the top are one file. (Through
/// a symbolic link the two could differ; then the jobs simply do not link.)
fn resolve(cwd: &str, path: &str) -> PathBuf {
    let mut resolved = PathBuf::new();
    for part in Path::new(cwd).join(path).components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                resolved.pop();
            }
            other => resolved.push(other),
        }
    }
    resolved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_waits_only_for_the_longer_jobs_of_its_own_burst() {
        let offered = |key: &str, offered_ms: u64, seconds: u64| JobRecord {
            offered_ms,
            ..job(key, "cc", "/src", offered_ms, offered_ms + seconds * 1000)
        };
        let newest = [
            offered("side", 0, 1),
            offered("chain", 5, 3),
            offered("other", 10, 1),
            offered("later", 500, 9),
        ];
        let waiting = HashMap::from([("chain".to_string(), 6.0)]);
        let offered_together = bursts(&newest, &waiting);
        let arrived = |keys: &[&str]| keys.iter().map(|key| key.to_string()).collect();
        assert!(offered_together.longer_one_coming("side", &arrived(&["side"])));
        assert!(!offered_together.longer_one_coming("side", &arrived(&["side", "chain"])));
        assert!(!offered_together.longer_one_coming("chain", &arrived(&["chain"])));
        // `later` is longer, but it came half a second after: another burst.
        assert!(!offered_together.longer_one_coming("other", &arrived(&["other", "chain"])));
        assert!(!offered_together.longer_one_coming("new", &arrived(&["new"])));
        // The newest build offered nothing when `side` (1 s) or `chain` (3 s) ended.
        assert!(!offered_together.longer_one_follows("side", 0.0, &arrived(&["side"])));
        assert!(!offered_together.longer_one_follows("chain", 0.0, &arrived(&["chain"])));
        let link = offered("link", 3_010, 9);
        let offered_together = bursts(&[newest[1].clone(), link], &waiting);
        assert!(offered_together.longer_one_follows("chain", 2.0, &arrived(&["chain"])));
        assert!(!offered_together.longer_one_follows("chain", 9.0, &arrived(&["chain"])));
        assert!(!offered_together.longer_one_follows("chain", 2.0, &arrived(&["chain", "link"])));
        assert_eq!(offered_together.path("chain"), 9.0);
        assert_eq!(offered_together.path("new"), 0.0);
        // A job offered after `tiny` ended may have waited for it; half a second more is not
        // worth holding a slot for.
        let tiny = JobRecord {
            offered_ms: 0,
            ..job("tiny", "cc", "/src", 0, 20)
        };
        let offered_together = bursts(
            &[tiny, offered("after", 25, 5), offered("close", 1, 0)],
            &HashMap::new(),
        );
        assert!(!offered_together.longer_one_coming("tiny", &arrived(&["tiny", "close"])));
        let near = JobRecord {
            offered_ms: 2,
            ..job("near", "cc", "/src", 2, 1_502)
        };
        let offered_together = bursts(&[offered("one", 0, 1), near], &HashMap::new());
        assert!(!offered_together.longer_one_coming("one", &arrived(&["one"])));
    }

    fn job(key: &str, command: &str, cwd: &str, start_ms: u64, end_ms: u64) -> JobRecord {
        JobRecord {
            key: key.into(),
            command: command.into(),
            cwd: cwd.into(),
            start_ms,
            end_ms,
            ..JobRecord::default()
        }
    }

    #[test]
    fn the_objects_a_link_reads_carry_the_link() {
        let jobs = [
            job("a", "g++ -c a.cpp -o obj/a.o", "/src", 0, 10_000),
            job("b", "g++ -c b.cpp -o obj/b.o", "/src", 0, 30_000),
            job("c", "g++ -c c.cpp -o /src/obj/c.o", "/src", 0, 20_000),
            // Run from another directory, naming the same files.
            job(
                "tool",
                "g++ -flto -o tool ../obj/a.o ./../obj/b.o",
                "/src/bin",
                30_000,
                130_000,
            ),
            job(
                "lib",
                "g++ -shared -olib.so obj/c.o",
                "/src",
                30_000,
                35_000,
            ),
        ];
        assert_eq!(
            named_inputs(&jobs),
            [vec![], vec![], vec![], vec![0, 1], vec![2]]
        );
        let full = waiting_seconds_by_key(&[jobs.to_vec()]);
        assert_eq!(full["a"], 100.0);
        assert_eq!(full["b"], 100.0);
        assert_eq!(full["c"], 5.0);
        assert_eq!(full["tool"], 0.0);

        // A rebuild of a.cpp alone, with a link that took 40 s this time.
        let rebuild = vec![
            job("a", "g++ -c a.cpp -o obj/a.o", "/src", 0, 10_000),
            job(
                "tool",
                "g++ -flto -o tool ../obj/a.o ../obj/b.o",
                "/src/bin",
                10_000,
                50_000,
            ),
        ];
        let recent = waiting_seconds_by_key(&[rebuild, jobs.to_vec()]);
        assert_eq!(recent["a"], 40.0);
        assert_eq!(recent["b"], 100.0, "b.o did not run in the rebuild");
    }

    #[test]
    fn reruns_pair_each_jobs_two_newest_clean_runs() {
        let run = |key: &str, end_ms: u64, cpu_ms: u64| JobRecord {
            cpu_ms,
            peak: cpu_ms << 20,
            exit_code: Some(0),
            attempts: 1,
            ..job(key, "cc", "/src", 0, end_ms)
        };
        let stopped = JobRecord {
            suspends: 1,
            ..run("b", 12_000, 12_000)
        };
        let failed = JobRecord {
            exit_code: Some(1),
            ..run("c", 1_000, 1_000)
        };
        let farmed = JobRecord {
            node: Some("10.0.0.5:3632".into()),
            ..run("d", 500, 500)
        };
        let builds = [
            vec![run("a", 11_000, 11_000), stopped, failed, farmed],
            vec![run("a", 10_000, 10_000), run("b", 9_000, 9_000)],
            vec![
                run("a", 8_000, 8_000),
                run("b", 10_000, 10_000),
                run("c", 2_000, 2_000),
                run("d", 3_000, 3_000),
            ],
        ];
        let seconds = |run: CleanRun| {
            assert_eq!(run.peak, (run.ran.cpu_seconds * 1000.0) as u64 * (1 << 20));
            (run.ran.cpu_seconds, run.ran.wall_seconds)
        };
        let pairs: Vec<_> = reruns(&builds)
            .into_iter()
            .map(|(earlier, later)| (seconds(earlier), seconds(later)))
            .collect();
        // b's stopped run, c's failed one and d's on a farm node do not count; a pairs only its
        // two newest runs; b's later run ended in an older build than a's, so it comes first.
        assert_eq!(
            pairs,
            vec![((10.0, 10.0), (9.0, 9.0)), ((10.0, 10.0), (11.0, 11.0))]
        );
    }
}
