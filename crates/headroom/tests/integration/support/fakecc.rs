//! The stand-in compiler (`crates/headroom-fakecc`) for the build tests. It is a package of
//! its own so that `cargo install` never puts it on a user's machine; a test binary builds it
//! once, with the cargo that runs the tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        escargot::CargoBuild::new()
            .package("headroom-fakecc")
            .bin("headroom-fakecc")
            .current_release()
            .run()
            .expect("cargo builds headroom-fakecc")
            .path()
            .to_path_buf()
    })
}

/// `program` run in the project `dir`, whose `bin/` (the stand-in compiler, as `g++`) comes
/// first on PATH, with headroom's state and runtime directories inside it.
pub fn command_in(dir: &Path, program: &str) -> Command {
    let mut command = Command::new(program);
    crate::support::in_project(&mut command, dir);
    command
}

/// What the stand-in compiler wrote into `object` about how it ran: `field` is `nice`,
/// `slice` or `cpu`.
pub fn object_says(object: &Path, field: &str) -> String {
    let text = std::fs::read_to_string(object).unwrap();
    let (_, after) = text
        .split_once(&format!(", {field} "))
        .unwrap_or_else(|| panic!("the fake compiler names its {field}: {text}"));
    after.split(',').next().unwrap().to_string()
}
