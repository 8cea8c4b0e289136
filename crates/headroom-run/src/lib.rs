//! `headroom run`: records memory per stage of any command, classifies its failure, and walks
//! a fallback ladder (the full configuration, then a smaller one, …) on memory failures only.

mod devices;
mod pools;
mod report;
mod stages;
mod supervise;
mod trace;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use headroom_config::BuildOverrides;
use headroom_diagnose::{classify, scan_bytes, Diagnosis};
use headroom_govern::session::Ending;
use headroom_govern::start::{start_session, Governed, StartError};
use headroom_process::{shell_code_of, Interrupts, SpawnError};
use regex::Regex;

use report::{Peaks, Report, RungReport, StagedDiagnosis};
use stages::StageDetector;
use supervise::Launch;

use headroom_output as output;

/// Arguments of `headroom run`.
#[derive(clap::Args)]
#[command(
    after_help = "Stages: print a line `##headroom stage NAME` from CMD (any language), or match existing log lines with --stage-regex.\n\
Fallbacks: each --fallback is either a command (`python train.py --small`) or only KEY=VALUE environment overrides applied to CMD (`MAX_JOBS=1 CC_OPT=-O1`)."
)]
pub struct RunArgs {
    /// How often to sample the process tree (`50ms`, `0.2s`, `1s`).
    #[arg(long, default_value = "50ms", value_name = "DUR", value_parser = parse_interval, env = "HEADROOM_RUN_INTERVAL")]
    interval: Duration,
    /// A regex over CMD's output lines that starts a stage; the stage is named by the group
    /// `(?<stage>…)`, else the first group, else the whole match.
    #[arg(long, value_name = "RE", value_parser = parse_stage_regex)]
    stage_regex: Option<Regex>,
    /// Run CMD in its own memory cgroup limited to SIZE (`8G`), no swap, to reproduce a smaller
    /// machine with the kernel's real OOM killer.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory_limit, env = "HEADROOM_RUN_MEMORY_LIMIT")]
    memory_limit: Option<u64>,
    /// Memory the compilers CMD starts (g++, nvcc, a JIT's compile jobs) may use together, as
    /// `headroom build --budget` takes it: a size (`6G`), a percentage of available memory
    /// (`70%`) or `auto` (available memory, cgroup room or --memory-limit, minus a reserve).
    /// CMD's own processes are not jobs, but their memory counts against it.
    /// [env: HEADROOM_BUDGET]
    // No `env =`: `BuildSettings::load` reads HEADROOM_BUDGET, so that a bad value is blamed
    // on the variable and not on this flag.
    #[arg(long, value_name = "SIZE|PERCENT", allow_hyphen_values = true)]
    budget: Option<String>,
    /// Next rung of the ladder, run only if the previous one failed for lack of memory.
    #[arg(long = "fallback", value_name = "CMD")]
    fallbacks: Vec<String>,
    /// Write the full report (samples, stages, diagnosis, rungs) as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write a self-contained HTML timeline with stage bands and the limit line.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Write an mprof-compatible `.dat` file (`mprof plot FILE`).
    #[arg(long, value_name = "FILE")]
    mprof: Option<PathBuf>,
    /// Write a Chrome trace (ui.perfetto.dev, chrome://tracing): rungs and stages as slices,
    /// RSS, GPU memory and MemAvailable as counters, an event where a rung ran out of memory.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// The command to run, after `--`.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = humantime::parse_duration(text)
        .map_err(|e| format!("{e}; write a duration such as `50ms`, `0.2s` or `1s`"))?;
    if interval < Duration::from_millis(1) {
        return Err("the interval must be at least 1ms".into());
    }
    Ok(interval)
}

fn parse_stage_regex(text: &str) -> Result<Regex, String> {
    Regex::new(text).map_err(|e| format!("not a valid regex (Rust `regex` syntax):\n{e}"))
}

fn parse_memory_limit(text: &str) -> Result<u64, String> {
    let bytes = headroom_size::parse_size(text).map_err(|e| e.to_string())?;
    if bytes < 4 << 20 {
        return Err(format!(
            "{text} is below the 4 MiB the kernel needs to start a process"
        ));
    }
    Ok(bytes)
}

/// One rung: what to run and with which environment overrides.
#[derive(Debug, Clone, PartialEq)]
struct Rung {
    argv: Vec<OsString>,
    env: Vec<(String, String)>,
}

/// A `--fallback` value: only `KEY=VALUE` words means "CMD with these overrides"; otherwise a
/// command line (shell quoting understood, no shell run), optionally led by `KEY=VALUE` words.
fn parse_fallback(text: &str, base: &[OsString]) -> anyhow::Result<Rung> {
    let words = shell_words::split(text)
        .with_context(|| format!("--fallback `{text}` has unbalanced quotes"))?;
    let assignments = words.iter().take_while(|w| is_assignment(w)).count();
    let env: Vec<(String, String)> = words[..assignments]
        .iter()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let argv = if assignments == words.len() {
        if env.is_empty() {
            anyhow::bail!("--fallback is empty; give a command or KEY=VALUE overrides");
        }
        base.to_vec()
    } else {
        words[assignments..].iter().map(OsString::from).collect()
    };
    Ok(Rung { argv, env })
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(key, _)| {
        !key.is_empty()
            && key.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
            && !key.starts_with(|c: char| c.is_ascii_digit())
    })
}

pub fn main(args: RunArgs) -> anyhow::Result<u8> {
    output::check_all([
        ("--json", args.json.as_deref()),
        ("--html", args.html.as_deref()),
        ("--mprof", args.mprof.as_deref()),
        ("--trace", args.trace.as_deref()),
    ])?;
    let mut rungs = vec![Rung {
        argv: args.command.clone(),
        env: Vec::new(),
    }];
    for fallback in &args.fallbacks {
        rungs.push(parse_fallback(fallback, &args.command)?);
    }
    let detector = StageDetector::new(args.stage_regex.clone());
    let interrupts = Interrupts::install(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
        .context("cannot install the Ctrl-C handler that forwards signals to CMD")?;
    // Without it, CMD's terminals keep the size they started with.
    let resizes = headroom_process::terminal::Resizes::install().ok();
    headroom_process::become_subreaper();
    let mut devices = devices::Devices::open();
    let mut report = Report {
        command: lossy(&args.command),
        memory_limit: args.memory_limit,
        interval_s: args.interval.as_secs_f64(),
        rungs: Vec::new(),
        succeeded_rung: None,
        interrupted: false,
        headroom_cpu_s: 0.0,
    };
    let mut exit_code = 0u8;
    for (index, rung) in rungs.iter().enumerate() {
        // Each rung has a governor of its own, so its report holds that rung's jobs, and a
        // fallback rung is predicted from what the rungs before it measured.
        let governed = govern(&args, rung)?;
        let compile_pools = governed
            .as_ref()
            .map(|governed| size_pools(governed.budget, rung));
        let mut env = rung.env.clone();
        env.extend(compile_pools.iter().flat_map(|pools| pools.set.clone()));
        let launch = Launch {
            program: rung.argv[0].clone(),
            args: rung.argv[1..].to_vec(),
            env,
            interval: args.interval,
            memory_limit: args.memory_limit,
            detector: &detector,
            rung: index,
            governor: governed.as_ref().map(|governed| &governed.session),
        };
        let outcome = supervise::run(&launch, &interrupts, resizes.as_ref(), &mut devices)?;
        let ending = governed.map(|governed| end_session(governed, &outcome));
        let mut outcome = match outcome {
            Ok(outcome) => outcome,
            Err(spawn_error) => {
                headroom_output::say!("headroom: error: {spawn_error}");
                let code = spawn_error.shell_code();
                match code {
                    Some(127) => {
                        headroom_output::say!("headroom: check the spelling of CMD or your PATH")
                    }
                    Some(_) => headroom_output::say!(
                        "headroom: {}",
                        headroom_process::how_to_run(&rung.argv[0])
                    ),
                    None => {}
                }
                write_outputs(&args, &report)?;
                return Ok(code.unwrap_or(2));
            }
        };
        let mut stages = stages::summarise(
            &outcome.stage_starts,
            &outcome
                .samples
                .iter()
                .map(|s| (s.t, s.rss))
                .collect::<Vec<_>>(),
            outcome.duration_s,
        );
        for stage in &mut stages {
            let within = |t: f64| t >= stage.start_s && t <= stage.end_s;
            // A GPU reading belongs to the stage it was taken in, not to the stage of the
            // sample that carried it: the last reading before a marker held the stage before.
            stage.gpu_peak_bytes = outcome
                .samples
                .iter()
                .filter(|s| s.gpu_read_s.is_some_and(within))
                .filter_map(|s| s.gpu)
                .max();
            stage.neuron_peak_bytes = outcome
                .samples
                .iter()
                .filter(|s| within(s.t))
                .filter_map(|s| s.neuron)
                .max();
        }
        let mut jobs = Vec::new();
        match ending {
            Some(Ending::Reported(build)) => {
                jobs = report::governed_jobs(&build, outcome.started_unix, &stages);
            }
            Some(Ending::Gone) => outcome.notes.push(
                "the governor stopped before CMD ended: the compilers CMD started from then on \
                 ran ungoverned, and none is listed"
                    .into(),
            ),
            Some(Ending::Silent(waited)) => outcome.notes.push(format!(
                "the governor did not answer for {:.0} s after CMD ended and was stopped: the \
                 compilers CMD started are not listed",
                waited.as_secs_f64()
            )),
            None => {}
        }
        let succeeded = outcome.exit.success();
        let diagnosis = diagnose(&outcome).map(|diagnosis| StagedDiagnosis {
            stage: stages.last().map_or_else(String::new, |s| s.name.clone()),
            is_memory: diagnosis.is_memory(),
            diagnosis,
        });
        let memory_failure = diagnosis.as_ref().is_some_and(|d| d.is_memory);
        exit_code = exit_status(&outcome.exit);
        report.rungs.push(RungReport {
            rung: index,
            command: lossy(&rung.argv),
            env: rung.env.clone(),
            started_unix: outcome.started_unix,
            duration_s: outcome.duration_s,
            exit_code: outcome.exit.code,
            signal: outcome.exit.signal,
            succeeded,
            peak: Peaks::from_samples(&outcome.samples, outcome.kernel.clone()),
            stages,
            diagnosis,
            tracking: outcome.tracking.to_string(),
            largest_processes: outcome.largest_processes.clone(),
            jobs,
            compile_pools,
            notes: outcome.notes.clone(),
            samples: outcome.samples,
        });
        if outcome.interrupted.is_some() {
            report.interrupted = true;
            break;
        }
        if succeeded {
            report.succeeded_rung = Some(index);
            break;
        }
        if !memory_failure {
            break;
        }
        if index + 1 < rungs.len() {
            headroom_output::say!(
                "headroom: rung {index} failed for lack of memory; trying rung {}",
                index + 1
            );
        }
    }
    report.headroom_cpu_s = headroom_probe::rusage::self_cpu_seconds();
    // A closed stderr (`2>&1 | head`) loses the table, not CMD's exit status.
    let _ = std::io::stderr().write_all(report::render_table(&report).as_bytes());
    write_outputs(&args, &report)?;
    Ok(exit_code)
}

/// Starts the governor of the compilers that `rung` starts, with the settings and budget
/// `headroom build` would use. Where none can start, the rung runs ungoverned, as it did
/// before headroom governed runs: the run is never lost to its governor.
fn govern(args: &RunArgs, rung: &Rung) -> anyhow::Result<Option<Governed>> {
    let overrides = BuildOverrides {
        budget: args.budget.clone(),
        ..BuildOverrides::default()
    };
    let command = format!("headroom run {}", lossy(&rung.argv).join(" "));
    let settings = headroom_config::session_settings(&overrides)?;
    match start_session(settings, true, command, None, args.memory_limit, None) {
        Ok(governed) => Ok(Some(governed)),
        // The error says its cause itself: the chain would say it twice.
        Err(StartError::Session(err)) => {
            headroom_output::say!(
                "headroom: warning: {err}; the compilers CMD starts run ungoverned"
            );
            Ok(None)
        }
        Err(err) => Err(err.into()),
    }
}

/// Sizes the compile-worker pools of what `rung` runs from `budget`: as many workers as it
/// holds at [`pools::DEFAULT_WORKER_COST`] each, at most one per CPU. A variable the user set
/// (in the environment, even empty, or in the rung's overrides) is kept.
fn size_pools(budget: u64, rung: &Rung) -> pools::PoolSizes {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    pools::size_pools(budget, pools::DEFAULT_WORKER_COST, cores, |name| {
        rung.env
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
            .or_else(|| std::env::var_os(name).map(|value| value.to_string_lossy().into_owned()))
    })
}

/// Ends the rung's governed session and takes its report.
fn end_session(governed: Governed, outcome: &Result<supervise::Outcome, SpawnError>) -> Ending {
    let exit_code = outcome
        .as_ref()
        .ok()
        .map(|outcome| i32::from(exit_status(&outcome.exit)));
    let interrupted = outcome
        .as_ref()
        .is_ok_and(|outcome| outcome.interrupted.is_some());
    governed.session.finish(exit_code, interrupted)
}

/// Why a rung failed. A SIGKILL that headroom sent itself (the user's second Ctrl-C) says
/// nothing about memory: then only what CMD printed, or the kernel's own record of a kill,
/// explains the failure.
fn diagnose(outcome: &supervise::Outcome) -> Option<Diagnosis> {
    if outcome.killed_by_headroom && outcome.exit.kernel_oom_evidence.is_none() {
        return scan_bytes(&outcome.output_tail)
            .findings
            .into_iter()
            .next()
            .map(|finding| finding.diagnosis);
    }
    classify(&outcome.output_tail, &outcome.exit)
}

/// CMD's own exit status, passed through; death by a signal reads as `128 + signal`, as in shells.
fn exit_status(exit: &headroom_diagnose::ExitInfo) -> u8 {
    shell_code_of(exit.code, exit.signal).map_or(2, |code| code.clamp(0, 255) as u8)
}

fn write_outputs(args: &RunArgs, report: &Report) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        let json =
            serde_json::to_string_pretty(report).context("cannot encode the report as JSON")?;
        output::write("--json", path, json.as_bytes())?;
    }
    if let Some(path) = &args.html {
        let html = headroom_report::chart::render_html(&report::timeline(report));
        output::write("--html", path, html.as_bytes())?;
    }
    if let Some(path) = &args.mprof {
        output::write("--mprof", path, report::render_mprof(report).as_bytes())?;
    }
    if let Some(path) = &args.trace {
        let json = serde_json::to_string(&trace::render(report))
            .context("cannot encode the trace as JSON")?;
        output::write("--trace", path, json.as_bytes())?;
    }
    Ok(())
}

fn lossy(argv: &[OsString]) -> Vec<String> {
    argv.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Vec<OsString> {
        vec!["python3".into(), "train.py".into()]
    }

    #[test]
    fn fallback_of_only_assignments_overrides_the_environment_of_cmd() {
        let rung = parse_fallback(
            "MAX_JOBS=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            &base(),
        )
        .unwrap();
        assert_eq!(rung.argv, base());
        assert_eq!(rung.env[0], ("MAX_JOBS".to_string(), "1".to_string()));
        assert_eq!(rung.env.len(), 2);
    }

    #[test]
    fn fallback_command_may_lead_with_assignments_and_quotes() {
        let rung =
            parse_fallback("DEVICE=cpu python3 train.py --dtype 'bf16 half'", &base()).unwrap();
        assert_eq!(rung.env, vec![("DEVICE".to_string(), "cpu".to_string())]);
        assert_eq!(
            rung.argv,
            ["python3", "train.py", "--dtype", "bf16 half"].map(OsString::from)
        );
    }

    #[test]
    fn bad_fallbacks_are_errors_naming_the_flag() {
        assert!(parse_fallback("", &base())
            .unwrap_err()
            .to_string()
            .contains("--fallback"));
        assert!(parse_fallback("echo 'open", &base())
            .unwrap_err()
            .to_string()
            .contains("--fallback"));
        assert!(!is_assignment("1X=2") && !is_assignment("=x") && is_assignment("A_1="));
    }

    #[test]
    fn bad_flag_values_explain_themselves() {
        assert!(parse_stage_regex("(unclosed")
            .unwrap_err()
            .contains("regex"));
        assert!(parse_interval("fast").unwrap_err().contains("50ms"));
        assert!(parse_memory_limit("8 parsecs")
            .unwrap_err()
            .contains("valid forms"));
        assert!(parse_memory_limit("1k").unwrap_err().contains("4 MiB"));
        assert_eq!(parse_memory_limit("8G"), Ok(8 << 30));
    }

    #[test]
    fn exit_status_passes_through() {
        use headroom_diagnose::ExitInfo;
        assert_eq!(exit_status(&ExitInfo::exited(3)), 3);
        assert_eq!(exit_status(&ExitInfo::signaled(9)), 137);
    }
}
