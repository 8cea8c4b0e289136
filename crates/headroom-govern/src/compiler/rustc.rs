//! rustc: its own flags, one argument per line in its `@path` files, and no farm engine
//! headroom drives carries it.

use super::{probe, Family, Ladder, ResponseFiles};

pub const FAMILY: Family = Family {
    name: "rustc",
    programs: &["rustc"],
    programs_without_version: &[],
    ladder: Ladder::None,
    response_files: ResponseFiles::Lines,
    farming: None,
    inner_tools: &[],
    is_probe: probe::asks_about_itself,
};
