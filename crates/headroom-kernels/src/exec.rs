//! Runs compile jobs with bounded parallelism. Every compiler process of `headroom kernels
//! build` starts here and nowhere else, so this is the one seam where the memory governor of
//! `headroom build` takes over admission (nvcc and ptxas jobs peak at several GiB each).

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use indicatif::ProgressBar;

/// One compile job: commands run in order; the job fails at the first failing command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Shown in progress and errors, e.g. `vector_add sm_80`.
    pub label: String,
    pub steps: Vec<Vec<OsString>>,
}

/// A program every compile command runs through, such as `headroom-launch`, which hands each
/// compile to the memory governor of `headroom build`; with the variables that lead it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    pub program: std::path::PathBuf,
    pub env: Vec<(OsString, OsString)>,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// A command exited unsuccessfully; `stderr` is the tail of its error output.
    Failed {
        command: String,
        code: Option<i32>,
        stderr: String,
    },
    /// A command could not be started at all.
    NotStarted {
        command: String,
        error: String,
    },
    /// Not run because an earlier job failed and the caller asked to stop.
    Cancelled,
}

/// The most stderr kept per failed job: enough for the compiler's first errors.
const STDERR_TAIL: usize = 4096;

fn tail(text: &str) -> String {
    let start = text.len().saturating_sub(STDERR_TAIL);
    let start = (start..text.len())
        .find(|index| text.is_char_boundary(*index))
        .unwrap_or(text.len());
    text[start..].trim().to_string()
}

fn run_job(job: &Job, launcher: Option<&Launcher>) -> Outcome {
    for argv in &job.steps {
        let Some((program, args)) = argv.split_first() else {
            continue;
        };
        let command = argv
            .iter()
            .map(|arg| arg.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let mut process = match launcher {
            Some(launcher) => {
                let mut process = Command::new(&launcher.program);
                process
                    .arg(program)
                    .envs(launcher.env.iter().map(|(k, v)| (k, v)));
                process
            }
            None => Command::new(program),
        };
        process.args(args).stdin(Stdio::null());
        // A process the compiler left holding its output (a compile server a wrapper
        // started) is not waited for.
        let output = match headroom_process::output_of(&mut process, None) {
            Ok(output) => output,
            Err(err) => {
                return Outcome::NotStarted {
                    command,
                    error: err.to_string(),
                }
            }
        };
        if !output.status.success() {
            let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            stderr.push_str(&String::from_utf8_lossy(&output.stdout));
            return Outcome::Failed {
                command,
                code: output.status.code(),
                stderr: tail(&stderr),
            };
        }
    }
    Outcome::Succeeded
}

/// Runs `jobs` on at most `parallelism` threads (at least one), ticking `progress` once per
/// finished job. With `stop_on_failure`, jobs not yet started after a failure are
/// [`Outcome::Cancelled`]. `finish` runs on the worker right after each job, so its results
/// (for the builder: a published artifact) exist even if the whole run is interrupted later.
/// Its results come back in the order of `jobs`.
pub fn execute<T: Send>(
    jobs: &[Job],
    parallelism: usize,
    stop_on_failure: bool,
    launcher: Option<&Launcher>,
    progress: &ProgressBar,
    finish: impl Fn(usize, Outcome) -> T + Sync,
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<T>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let workers = parallelism.clamp(1, jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(index) else { break };
                let outcome = if stop_on_failure && failed.load(Ordering::Relaxed) {
                    Outcome::Cancelled
                } else {
                    progress.set_message(job.label.clone());
                    run_job(job, launcher)
                };
                if outcome != Outcome::Succeeded {
                    failed.store(true, Ordering::Relaxed);
                }
                let result = finish(index, outcome);
                progress.inc(1);
                results
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())[index] = Some(result);
            });
        }
    });
    // A worker that panicked re-raises its panic when the scope ends, so every slot is filled.
    results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(label: &str, steps: &[&[&str]]) -> Job {
        Job {
            label: label.into(),
            steps: steps
                .iter()
                .map(|argv| argv.iter().map(OsString::from).collect())
                .collect(),
        }
    }

    #[test]
    fn outcomes_keep_job_order_and_report_failures() {
        let jobs = [
            job("ok", &[&["true"], &["true"]]),
            job(
                "fails",
                &[&["sh", "-c", "echo boom >&2; exit 3"], &["true"]],
            ),
            job("missing", &[&["headroom-no-such-program"]]),
        ];
        let outcomes = execute(
            &jobs,
            2,
            false,
            None,
            &ProgressBar::hidden(),
            |_, outcome| outcome,
        );
        assert_eq!(outcomes[0], Outcome::Succeeded);
        assert_eq!(
            outcomes[1],
            Outcome::Failed {
                command: "sh -c echo boom >&2; exit 3".into(),
                code: Some(3),
                stderr: "boom".into()
            }
        );
        assert!(
            matches!(&outcomes[2], Outcome::NotStarted { command, .. } if command == "headroom-no-such-program")
        );
    }

    #[test]
    fn a_failed_step_stops_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let marker_arg = marker.to_str().unwrap();
        let outcomes = execute(
            &[job("j", &[&["false"], &["touch", marker_arg]])],
            1,
            false,
            None,
            &ProgressBar::hidden(),
            |_, outcome| outcome,
        );
        assert!(matches!(outcomes[0], Outcome::Failed { .. }));
        assert!(!marker.exists());
    }

    #[test]
    fn stop_on_failure_cancels_the_jobs_not_started() {
        let jobs = [job("fails", &[&["false"]]), job("later", &[&["true"]])];
        assert_eq!(
            execute(
                &jobs,
                1,
                true,
                None,
                &ProgressBar::hidden(),
                |_, outcome| outcome
            )[1],
            Outcome::Cancelled
        );
        assert_eq!(
            execute(
                &jobs,
                1,
                false,
                None,
                &ProgressBar::hidden(),
                |_, outcome| { outcome }
            )[1],
            Outcome::Succeeded
        );
    }

    #[test]
    fn tail_keeps_the_end_on_a_char_boundary() {
        let text = "é".repeat(STDERR_TAIL);
        assert!(tail(&text).len() <= STDERR_TAIL);
        assert_eq!(tail("short\n"), "short");
    }
}
