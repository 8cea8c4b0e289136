//! nvcc, CUDA's compiler driver: its own flags (the ladder's gcc flags do not apply), farmed
//! only by sccache-dist, and the CUDA tools it runs below itself.

use headroom_farm::{FarmStyle, Farming};
use headroom_sched::ladder::Rung;

use super::{probe, Family, Ladder, ResponseFiles};

pub const FAMILY: Family = Family {
    name: "nvcc",
    programs: &["nvcc"],
    programs_without_version: &[],
    ladder: Ladder::NvccThreads,
    response_files: ResponseFiles::Libiberty,
    farming: Some(Farming {
        style: FarmStyle::Nvcc,
        is_source,
    }),
    inner_tools: &["cicc", "cudafe++", "ptxas", "fatbinary", "nvlink"],
    is_probe: probe::asks_about_itself,
};

/// nvcc's rung of the flag ladder for a job whose `args` let it build several targets at once
/// (`--threads N` or `-t N` with N other than 1; 0 means all of them): the same job one target
/// at a time. nvcc takes the last `--threads` it is given, and says so in a warning.
pub(super) fn one_target_at_a_time(args: &[String]) -> Option<Rung> {
    let mut threads = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--threads" || arg == "-t" {
            threads = args.next().map(String::as_str);
        } else if let Some(value) = arg.strip_prefix("--threads=").or_else(|| {
            // `-t4`, but not nvcc's other flags that begin so (`-time`, `-target-dir`).
            let value = arg.strip_prefix("-t=").or_else(|| arg.strip_prefix("-t"))?;
            value.bytes().all(|b| b.is_ascii_digit()).then_some(value)
        }) {
            threads = Some(value);
        }
    }
    let several = threads.is_some_and(|value| value.trim().parse::<u32>() != Ok(1));
    several.then(|| Rung {
        edits: vec!["+--threads".into(), "+1".into()],
    })
}

/// A CUDA source.
fn is_source(arg: &str) -> bool {
    std::path::Path::new(arg)
        .extension()
        .is_some_and(|extension| extension == "cu")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split(' ').map(String::from).collect()
    }

    #[test]
    fn only_a_job_that_builds_targets_at_once_gets_the_rung_and_it_ends_with_one_thread() {
        for several in [
            "--threads 4 -c a.cu",
            "--threads=0 -c a.cu",
            "-t 2 -c a.cu",
            "-t2 -c a.cu",
            "--threads 1 -c a.cu --threads 3",
        ] {
            let rung = one_target_at_a_time(&args(several)).unwrap_or_else(|| panic!("{several}"));
            let lowered: Vec<String> = rung
                .apply(
                    &args(several)
                        .into_iter()
                        .map(Into::into)
                        .collect::<Vec<_>>(),
                )
                .into_iter()
                .map(|arg| arg.into_string().unwrap())
                .collect();
            assert_eq!(
                lowered[lowered.len() - 2..],
                ["--threads", "1"],
                "{several}"
            );
        }
        for one in [
            "-c a.cu",
            "--threads 1 -c a.cu",
            "-t1 -c a.cu",
            "--threads 4 -t 1 -c a.cu",
            "-time t.csv -target-dir x -c a.cu",
        ] {
            assert_eq!(one_target_at_a_time(&args(one)), None, "{one}");
        }
    }
}
