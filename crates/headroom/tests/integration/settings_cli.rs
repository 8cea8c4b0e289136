//! Settings through the real binary, in a fresh directory with `HOME` and the XDG variables
//! pointed into it: a wrong budget names where it was written (file and line, variable or
//! flag), a `HEADROOM_CONFIG` naming no file is an error while a missing default file is
//! not, and the build reports the budget it took from `headroom.toml` as set there.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;

/// A project directory with `headroom.toml` (when written) and a home of its own.
struct Place {
    dir: tempfile::TempDir,
}

impl Place {
    fn new() -> Place {
        let place = Place {
            dir: tempfile::tempdir().unwrap(),
        };
        for dir in ["project", "home", "run", "state"] {
            std::fs::create_dir_all(place.path(dir)).unwrap();
        }
        place
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    fn write(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `headroom ARGS…` in the project, reading no settings but this place's.
    fn headroom(&self, args: &[&str], env: &[(&str, &Path)]) -> Output {
        let mut command = support::headroom(args);
        command
            .current_dir(self.path("project"))
            .env("HOME", self.path("home"))
            .env("XDG_RUNTIME_DIR", self.path("run"))
            .env("HEADROOM_STATE_DIR", self.path("state"));
        for (name, value) in env {
            command.env(name, value);
        }
        command.output().expect("run headroom")
    }

    /// `headroom build -- true` without a history; its exit code and stderr.
    fn build(&self, env: &[(&str, &Path)]) -> (Option<i32>, String) {
        let output = self.headroom(&["build", "--no-history", "--", "true"], env);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code(), stderr)
    }
}

/// Asserts that a refused build said what is wrong with the budget, where, and what to write.
fn assert_names_bad_budget(code: Option<i32>, stderr: &str, place: &str, value: &str) {
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(place) && stderr.contains(value),
        "no {place} and {value} in: {stderr}"
    );
    for form in ["`6G`", "`70%`", "`auto`"] {
        assert!(stderr.contains(form), "no {form} in: {stderr}");
    }
}

#[test]
fn a_bad_budget_in_headroom_toml_names_the_file_and_line() {
    let place = Place::new();
    let file = place.write(
        "project/headroom.toml",
        "[build]\njobs = 2\nbudget = \"six\"\n",
    );
    let (code, stderr) = place.build(&[]);
    let written = format!("`budget = \"six\"` on line 3 of {}", file.display());
    assert_names_bad_budget(code, &stderr, &written, "six");
    assert!(!stderr.contains("--budget"), "{stderr}");
}

#[test]
fn a_bad_budget_in_the_user_settings_names_that_file_and_line() {
    let place = Place::new();
    let file = place.write(
        "home/.config/headroom/config.toml",
        "[build]\nbudget = \"150%\"\n",
    );
    let (code, stderr) = place.build(&[]);
    let written = format!("`budget = \"150%\"` on line 2 of {}", file.display());
    assert_names_bad_budget(code, &stderr, &written, "at most 100");
}

#[test]
fn a_bad_headroom_budget_names_the_variable() {
    let place = Place::new();
    let (code, stderr) = place.build(&[("HEADROOM_BUDGET", Path::new("lots"))]);
    assert_names_bad_budget(code, &stderr, "HEADROOM_BUDGET `lots`", "neither");
    assert!(!stderr.contains("--budget"), "{stderr}");
    // The flag beats the variable, and is named when it is the one that is wrong.
    let output = place.headroom(
        &["build", "--no-history", "--budget", "0", "--", "true"],
        &[("HEADROOM_BUDGET", Path::new("4G"))],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_names_bad_budget(output.status.code(), &stderr, "--budget `0`", "no job");
}

#[test]
fn a_headroom_config_naming_no_file_is_an_error_and_a_missing_default_is_not() {
    let place = Place::new();
    let named = place.path("nowhere/config.toml");
    let (code, stderr) = place.build(&[("HEADROOM_CONFIG", &named)]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "HEADROOM_CONFIG names {}, which does not exist",
            named.display()
        )),
        "{stderr}"
    );
    let (code, stderr) = place.build(&[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn the_build_says_its_budget_was_set_in_headroom_toml() {
    let place = Place::new();
    let file = place.write("project/headroom.toml", "[build]\nbudget = \"6G\"\n");
    // A build with a history prints its summary, budget and source included.
    let output = place.headroom(&["build", "--", "true"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let expected = format!(
        "6.00 GiB budget (set by `budget` under [build] on line 2 of {})",
        file.display()
    );
    assert!(stderr.contains(&expected), "no {expected} in: {stderr}");
}
