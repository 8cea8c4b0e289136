//! `headroom sim`: compares scheduling policies on build traces over simulated machines, or
//! with `--sessions` several builds at once under one governor against one governor each, and
//! `headroom sim generate` writes the synthetic trace corpus.

use std::path::PathBuf;

use anyhow::Context;
use headroom_sim::generate::{generate, SYNTHETIC_TRACES};
use headroom_sim::import::{trace_from_report, ImportOptions};
use headroom_sim::{
    compare, compare_sessions, report, site_name, BudgetSpec, FarmSpec, Machine, PolicySpec,
    SimConfig, Trace, Workload, ALL_POLICIES, FARM_POLICIES,
};
use headroom_size::Size;
use indicatif::{ProgressBar, ProgressStyle};

use headroom_output as output;

/// Arguments of `headroom sim`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    command: Option<SimCommand>,
    /// Trace files (JSON, schema 1; see the headroom-sim crate docs), e.g. `traces/*.json`.
    #[arg(value_name = "TRACE")]
    traces: Vec<PathBuf>,
    /// Machines to simulate, as cores/memory.
    #[arg(
        long = "machine",
        value_name = "CORES/MEMORY",
        value_delimiter = ',',
        default_values = ["16c/32G", "64c/128G", "192c/1T"],
        env = "HEADROOM_SIM_MACHINES"
    )]
    machines: Vec<Machine>,
    /// Build farms to simulate beside each machine, as nodes x each node's cores/memory
    /// (`32x16c/64G`); several, comma-separated, for a sweep. Each node runs one compile per
    /// core.
    #[arg(
        long = "farm",
        value_name = "NODESxCORES/MEMORY",
        value_delimiter = ','
    )]
    farms: Vec<FarmSpec>,
    /// Policies to compare (default: all but clairvoyant; with --farm: headroom,
    /// headroom-warm, sccache-dist, icecream): headroom, headroom-warm, static, static=N,
    /// ninja, parallel-memfree[=SIZE], parallel-memsuspend[=SIZE], buck2, bazel, bazel-inputs,
    /// clairvoyant (a reference that knows every job's exact memory curve), and with --farm
    /// sccache-dist and icecream (the engines placing compiles by themselves).
    #[arg(long = "policy", value_name = "POLICY", value_delimiter = ',')]
    policies: Vec<PolicySpec>,
    /// Seed of the run-to-run variation of peaks and durations.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Largest relative change of each job's peak and duration (0.03 = ±3%).
    #[arg(long, default_value_t = 0.03)]
    variation: f64,
    /// Change of every job's peak at once, which no history knows of (0.1 = all 10% larger):
    /// how the policies cope with an edited header that every unit includes.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    growth: f64,
    /// headroom's memory budget on each machine, as `headroom build --budget` takes it: `auto`
    /// (the machine's memory less the governor's reserve of 10%, 256 MiB to 2 GiB), a size
    /// such as `28G`, or a percentage of the machine's memory such as `100%`.
    #[arg(long, value_name = "SIZE|PERCENT", default_value = "auto")]
    budget: BudgetSpec,
    /// Simulate N builds at once on each machine, as sessions: the traces given, in turn
    /// (`--sessions 4 a.json b.json` runs a, b, a and b), under one governor that every session
    /// joins, under one governor per session that each take the whole budget as their own,
    /// and as one session over the union of the builds. Compares headroom and headroom-warm.
    #[arg(long, value_name = "N")]
    sessions: Option<usize>,
    /// Print every `-jN` of the static sweep, not only the best ones.
    #[arg(long)]
    every_static: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write a self-contained HTML page with a chart per trace and machine.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum SimCommand {
    /// Write synthetic traces that match published memory figures.
    Generate(GenerateArgs),
    /// Turn a build from the history (or a `headroom build --report` JSON) into a trace.
    Import(ImportArgs),
}

#[derive(clap::Args)]
struct ImportArgs {
    /// A build id from the history, or a JSON file written by `headroom build --report` or
    /// `headroom report --json` [default: the last build].
    #[arg(value_name = "BUILD|REPORT.json")]
    build: Option<String>,
    /// Where to write the trace.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Name of the trace in reports (default: the file name of --out).
    #[arg(long)]
    name: Option<String>,
    /// The machine the build ran on (default: this one).
    #[arg(long, value_name = "CORES/MEMORY")]
    machine: Option<Machine>,
    /// The `-j` the build system ran with (default: the `-jN` in the build command, else the
    /// machine's cores).
    #[arg(long, value_name = "N")]
    jobs_flag: Option<usize>,
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// Traces to write (default: all): flash-attention, torch-extension, lto-links, llvm-like,
    /// rustc-heavy.
    #[arg(value_name = "NAME")]
    names: Vec<String>,
    /// Seed of the generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory to write `NAME.json` into.
    #[arg(long, default_value = "traces")]
    out: PathBuf,
}

pub fn main(args: SimArgs) -> anyhow::Result<u8> {
    match args.command {
        Some(SimCommand::Generate(generate_args)) => return generate_traces(generate_args),
        Some(SimCommand::Import(import_args)) => return import_trace(import_args),
        None => {}
    }
    if args.traces.is_empty() {
        anyhow::bail!(
            "no trace given: pass trace files, e.g. `headroom sim traces/*.json`, or write the \
             synthetic ones with `headroom sim generate`"
        );
    }
    if !(0.0..1.0).contains(&args.variation) {
        anyhow::bail!(
            "--variation must be at least 0 and below 1, not {}",
            args.variation
        );
    }
    if !(-0.5..=1.0).contains(&args.growth) {
        anyhow::bail!(
            "--growth must be between -0.5 and 1 (half to twice the recorded peaks), not {}",
            args.growth
        );
    }
    if let BudgetSpec::Bytes(bytes) = args.budget {
        if let Some(small) = args.machines.iter().find(|machine| machine.memory < bytes) {
            anyhow::bail!(
                "--budget {} is more memory than machine {small} has; give a percentage such as \
                 `90%`, or simulate machines with more memory",
                Size(bytes)
            );
        }
    }
    let config = SimConfig {
        seed: args.seed,
        variation: args.variation,
        growth: args.growth,
        budget: args.budget,
        ..SimConfig::default()
    };
    if let Some(sessions) = args.sessions {
        return simulate_sessions(&args, sessions, &config);
    }
    output::check_all([("--html", args.html.as_deref())])?;
    let policies = match (args.policies.is_empty(), args.farms.is_empty()) {
        (true, true) => ALL_POLICIES.to_vec(),
        (true, false) => FARM_POLICIES.to_vec(),
        (false, _) => args.policies,
    };
    // One run without a farm, or one per farm.
    let farms: Vec<Option<FarmSpec>> = if args.farms.is_empty() {
        vec![None]
    } else {
        args.farms.into_iter().map(Some).collect()
    };
    // Drawn only on a terminal: large traces on many machines take a while.
    let progress = ProgressBar::new((args.traces.len() * args.machines.len() * farms.len()) as u64);
    if let Ok(style) = ProgressStyle::with_template("simulating [{bar:30}] {pos}/{len} {wide_msg}")
    {
        progress.set_style(style.progress_chars("=> "));
    }
    let mut comparisons = Vec::new();
    for path in &args.traces {
        let trace = Trace::load(path).context("loading a trace given on the command line")?;
        let workload = Workload::new(&trace, &config);
        for &machine in &args.machines {
            for &farm in &farms {
                let farm_name = farm.map(|farm| farm.to_string());
                let site = site_name(&machine.to_string(), farm_name.as_deref());
                progress.set_message(format!("{} on {site}", trace.name));
                let config = SimConfig { farm, ..config };
                let comparison = compare(&workload, machine, &policies, &config)
                    .with_context(|| format!("simulating {} on {site}", path.display()))?;
                comparisons.push(comparison);
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&comparisons)?);
    } else {
        print!("{}", report::table(&comparisons, args.every_static));
    }
    if let Some(path) = args.html {
        output::write("--html", &path, report::html(&comparisons).as_bytes())?;
    }
    Ok(0)
}

/// `headroom sim --sessions N`: the traces as `sessions` builds at once on each machine,
/// under each way of governing them.
fn simulate_sessions(args: &SimArgs, sessions: usize, config: &SimConfig) -> anyhow::Result<u8> {
    anyhow::ensure!(
        sessions >= 2,
        "--sessions {sessions}: give 2 or more builds at once; without --sessions each trace is \
         simulated alone"
    );
    anyhow::ensure!(
        args.farms.is_empty(),
        "--sessions and --farm do not go together: the sessions share one machine; leave one out"
    );
    anyhow::ensure!(
        args.html.is_none(),
        "--html charts one build per trace; leave it out with --sessions"
    );
    let mut warm_or_cold = Vec::new();
    for &policy in &args.policies {
        let PolicySpec::Headroom { warm } = policy else {
            anyhow::bail!(
                "--policy {policy} does not govern sessions; with --sessions, give headroom, \
                 headroom-warm or both"
            );
        };
        warm_or_cold.push(warm);
    }
    if warm_or_cold.is_empty() {
        warm_or_cold = vec![false, true];
    }
    let traces = args
        .traces
        .iter()
        .map(|path| Trace::load(path))
        .collect::<Result<Vec<Trace>, _>>()
        .context("loading a trace given on the command line")?;
    let builds: Vec<Trace> = (0..sessions)
        .map(|session| traces[session % traces.len()].clone())
        .collect();
    let workload = Workload::sessions(&builds, config);
    let mut comparisons = Vec::new();
    for &machine in &args.machines {
        for &warm in &warm_or_cold {
            let comparison = compare_sessions(&workload, machine, warm, config)
                .with_context(|| format!("simulating {} on {machine}", workload.name))?;
            comparisons.push(comparison);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&comparisons)?);
    } else {
        print!("{}", report::sessions_table(&comparisons));
    }
    Ok(0)
}

fn generate_traces(args: GenerateArgs) -> anyhow::Result<u8> {
    let names: Vec<&str> = if args.names.is_empty() {
        SYNTHETIC_TRACES.to_vec()
    } else {
        args.names.iter().map(String::as_str).collect()
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating the --out directory {}", args.out.display()))?;
    for name in names {
        let trace = generate(name, args.seed).with_context(|| {
            format!(
                "`{name}` is not a synthetic trace; known: {}",
                SYNTHETIC_TRACES.join(", ")
            )
        })?;
        let path = args.out.join(format!("{name}.json"));
        output::write("--out", &path, trace.to_json().as_bytes())?;
        headroom_output::say!("wrote {} ({} jobs)", path.display(), trace.jobs.len());
    }
    Ok(0)
}

fn import_trace(args: ImportArgs) -> anyhow::Result<u8> {
    output::check("--out", &args.out)?;
    let report = headroom_store::shown::load(args.build.as_deref())?.report;
    let farmed = report.jobs.iter().filter(|job| job.node.is_some()).count();
    anyhow::ensure!(
        farmed == 0,
        "build {} compiled {farmed} jobs on farm nodes, where headroom measures neither their memory nor their time; import a build run without --farm",
        report.build.id
    );
    let machine = match args.machine {
        Some(machine) => machine,
        None => this_machine()?,
    };
    let name = match args.name {
        Some(name) => name,
        None => args
            .out
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned())
            .context("--out has no file name; pass --name")?,
    };
    let jobs_flag = args
        .jobs_flag
        .or_else(|| jobs_flag_of(&report.build.command))
        .unwrap_or(machine.cores);
    let options = ImportOptions {
        name,
        machine,
        jobs_flag,
        named_inputs: headroom_govern::last_build::named_inputs(&report.jobs),
    };
    let trace = trace_from_report(&report, &options);
    trace.validate()?;
    output::write("--out", &args.out, trace.to_json().as_bytes())?;
    headroom_output::say!(
        "wrote {} ({} jobs, recorded on {machine} with -j{jobs_flag})",
        args.out.display(),
        trace.jobs.len()
    );
    Ok(0)
}

/// Cores and total memory of this machine.
fn this_machine() -> anyhow::Result<Machine> {
    let cores = std::thread::available_parallelism()
        .context("cannot count this machine's CPUs; pass --machine")?
        .get();
    let memory = headroom_probe::meminfo::read_meminfo()
        .context("cannot read this machine's memory; pass --machine")?
        .total;
    Ok(Machine { cores, memory })
}

/// The `N` of `-jN`, `-j N` or `--jobs N` in a build command.
fn jobs_flag_of(command: &str) -> Option<usize> {
    let words: Vec<&str> = command.split_whitespace().collect();
    words.iter().enumerate().find_map(|(index, word)| {
        let attached = word.strip_prefix("-j").filter(|rest| !rest.is_empty());
        let value = match (*word, attached) {
            (_, Some(rest)) => rest,
            ("-j" | "--jobs", None) => words.get(index + 1)?,
            _ => return None,
        };
        value.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_jobs_flag_of_a_build_command() {
        assert_eq!(jobs_flag_of("make -j4"), Some(4));
        assert_eq!(jobs_flag_of("cargo build -j 2"), Some(2));
        assert_eq!(jobs_flag_of("ninja --jobs 8 all"), Some(8));
        assert_eq!(jobs_flag_of("make"), None);
    }
}
