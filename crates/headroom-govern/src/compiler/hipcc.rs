//! hipcc, ROCm's compiler driver: it runs clang (a family of its own, governed by name), and
//! no farm engine carries it.

use super::{probe, Family, Ladder, ResponseFiles};

pub const FAMILY: Family = Family {
    name: "hipcc",
    programs: &["hipcc"],
    programs_without_version: &[],
    ladder: Ladder::None,
    response_files: ResponseFiles::Libiberty,
    farming: None,
    inner_tools: &[],
    is_probe: probe::asks_about_itself,
};
