//! gcc and clang, and the names distributions give them (`cc`, `c++`): one family, since they
//! take the same flags, read `@file`s alike and farm alike.

use headroom_farm::{FarmStyle, Farming};

use super::{probe, Family, Ladder, ResponseFiles};

pub const FAMILY: Family = Family {
    name: "gcc/clang",
    programs: &["gcc", "g++", "cc", "c++", "clang", "clang++"],
    programs_without_version: &[],
    ladder: Ladder::GccFlags,
    response_files: ResponseFiles::Libiberty,
    farming: Some(Farming {
        style: FarmStyle::Gcc,
        is_source,
    }),
    // gcc's passes and the assembler and linker driver it runs; clang runs itself (`-cc1`).
    inner_tools: &[
        "cc1",
        "cc1plus",
        "cc1obj",
        "f951",
        "lto1",
        "lto-wrapper",
        "collect2",
        "as",
    ],
    is_probe: probe::asks_about_itself,
};

/// A C or C++ source (or its preprocessed form) as gcc and clang take it.
fn is_source(arg: &str) -> bool {
    matches!(
        std::path::Path::new(arg)
            .extension()
            .and_then(|e| e.to_str()),
        Some("c" | "cc" | "cp" | "cpp" | "cxx" | "c++" | "C" | "CPP" | "i" | "ii")
    )
}
