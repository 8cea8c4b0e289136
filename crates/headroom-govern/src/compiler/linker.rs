//! Linkers: GNU ld and the linkers it may stand for (`ld.gold`, `ld.lld`), lld and mold. A
//! link of a large binary is often a build's largest job; no farm engine carries one.

use super::{probe, Family, Ladder, ResponseFiles};

pub const FAMILY: Family = Family {
    name: "linker",
    programs: &["ld", "lld", "mold"],
    programs_without_version: &["ld.bfd", "ld.gold", "ld.lld", "ld.mold"],
    ladder: Ladder::None,
    response_files: ResponseFiles::Libiberty,
    farming: None,
    inner_tools: &[],
    is_probe: probe::asks_about_itself,
};
