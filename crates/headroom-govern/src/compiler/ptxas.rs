//! ptxas, CUDA's assembler, as a family of its own: JIT compilers run it by themselves
//! (Triton calls it for each kernel). Inside an nvcc job it is one of nvcc's inner tools.

use super::{probe, Family, Ladder, ResponseFiles};

pub const FAMILY: Family = Family {
    name: "ptxas",
    programs: &["ptxas"],
    programs_without_version: &[],
    ladder: Ladder::None,
    response_files: ResponseFiles::Libiberty,
    farming: None,
    inner_tools: &[],
    is_probe: probe::asks_about_itself,
};
