//! `headroom sim`: compares scheduling policies on build traces over simulated machines, and
//! `headroom sim generate` writes the synthetic trace corpus.

use std::path::PathBuf;

use anyhow::Context;
use headroom_sim::generate::{generate, SYNTHETIC_TRACES};
use headroom_sim::{
    compare, report, Machine, PolicySpec, SimConfig, Trace, Workload, ALL_POLICIES,
};

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
    /// Policies to compare (default: all): headroom, headroom-warm, static, static=N, ninja,
    /// parallel-memfree[=SIZE], parallel-memsuspend[=SIZE], buck2, bazel, bazel-inputs.
    #[arg(long = "policy", value_name = "POLICY", value_delimiter = ',')]
    policies: Vec<PolicySpec>,
    /// Seed of the run-to-run variation of peaks and durations.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Largest relative change of each job's peak and duration (0.03 = ±3%).
    #[arg(long, default_value_t = 0.03)]
    variation: f64,
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
    if let Some(SimCommand::Generate(generate_args)) = args.command {
        return generate_traces(generate_args);
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
    let config = SimConfig {
        seed: args.seed,
        variation: args.variation,
        ..SimConfig::default()
    };
    let policies = if args.policies.is_empty() {
        ALL_POLICIES.to_vec()
    } else {
        args.policies
    };
    let mut comparisons = Vec::new();
    for path in &args.traces {
        let trace = Trace::load(path).context("loading a trace given on the command line")?;
        let workload = Workload::new(&trace, &config);
        for &machine in &args.machines {
            let comparison = compare(&workload, machine, &policies, &config)
                .with_context(|| format!("simulating {} on {machine}", path.display()))?;
            comparisons.push(comparison);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&comparisons)?);
    } else {
        print!("{}", report::table(&comparisons, args.every_static));
    }
    if let Some(path) = args.html {
        std::fs::write(&path, report::html(&comparisons))
            .with_context(|| format!("writing the --html page to {}", path.display()))?;
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
        trace.save(&path)?;
        eprintln!("wrote {} ({} jobs)", path.display(), trace.jobs.len());
    }
    Ok(0)
}
