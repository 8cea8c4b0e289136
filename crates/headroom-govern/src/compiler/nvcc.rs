//! nvcc, CUDA's compiler driver: its own flags (the ladder's gcc flags do not apply), farmed
//! only by sccache-dist, and the CUDA tools it runs below itself.

use headroom_farm::{FarmStyle, Farming};

use super::{probe, Family, ResponseFiles};

pub const FAMILY: Family = Family {
    name: "nvcc",
    programs: &["nvcc"],
    programs_without_version: &[],
    gcc_flags: false,
    response_files: ResponseFiles::Libiberty,
    farming: Some(Farming {
        style: FarmStyle::Nvcc,
        is_source,
    }),
    inner_tools: &["cicc", "cudafe++", "ptxas", "fatbinary", "nvlink"],
    is_probe: probe::asks_about_itself,
};

/// A CUDA source.
fn is_source(arg: &str) -> bool {
    std::path::Path::new(arg)
        .extension()
        .is_some_and(|extension| extension == "cu")
}
