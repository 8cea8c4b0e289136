//! What the governor takes from the last build beyond each job's own history: the chains of
//! jobs that waited on each job, so the queue can start first the jobs that hold the most of
//! the build up (`headroom_sched::chain`). A job waited on another when the other's `-o` file
//! is among its arguments: the objects a link reads, the archive a later link reads. Jobs
//! that name their outputs otherwise (rustc's `--out-dir`) link nothing.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use headroom_sched::chain::{waiting_seconds, Finished};
use headroom_store::JobRecord;

use crate::job::JobIdentity;

/// Seconds of work that waited on each job of `jobs` (one build's), by job key.
pub fn waiting_seconds_by_key(jobs: &[JobRecord]) -> HashMap<String, f64> {
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
    let finished: Vec<Finished> = jobs
        .iter()
        .zip(&arguments)
        .enumerate()
        .map(|(index, (job, words))| Finished {
            seconds: job.end_ms.saturating_sub(job.start_ms) as f64 / 1000.0,
            // Its own `-o` file is among its words too.
            inputs: words
                .iter()
                .skip(1)
                .filter_map(|word| made_by.get(&resolve(&job.cwd, word)).copied())
                .filter(|&maker| maker != index)
                .collect(),
        })
        .collect();
    jobs.iter()
        .map(|job| job.key.clone())
        .zip(waiting_seconds(&finished))
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
        let waiting = waiting_seconds_by_key(&jobs);
        assert_eq!(waiting["a"], 100.0);
        assert_eq!(waiting["b"], 100.0);
        assert_eq!(waiting["c"], 5.0);
        assert_eq!(waiting["tool"], 0.0);
    }
}
