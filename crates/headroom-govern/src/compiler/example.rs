//! A made-up family, registered for the tests only, that answers every question differently
//! from the real ones: the proof that a family is one file (and its line in `FAMILIES`), and
//! that every question headroom asks reaches it (`tests::a_family_in_one_file_answers_every_question`).

use std::ffi::OsString;

use headroom_farm::{FarmStyle, Farming};

use super::{Family, Ladder, ResponseFiles};

pub const FAMILY: Family = Family {
    name: "example",
    programs: &["examplecc"],
    programs_without_version: &["examplecc.fast"],
    ladder: Ladder::GccFlags,
    response_files: ResponseFiles::Lines,
    farming: Some(Farming {
        style: FarmStyle::Gcc,
        is_source: |arg| arg.ends_with(".ex"),
    }),
    inner_tools: &["example-backend"],
    is_probe: |args| args == [OsString::from("--which")],
};
