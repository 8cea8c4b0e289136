//! The opt-in lower-memory flag ladder: for a job that runs out of memory even alone, rebuild
//! it with cheaper flags, one rung at a time.
//!
//! A rung is a list of edits written as text, so `headroom.toml` can define its own:
//! `PATTERN=REPLACEMENT` replaces every argument matching PATTERN (exact, or a prefix ending
//! in `*`); an empty REPLACEMENT removes it; `+FLAG` appends FLAG.
//!
//! Policy data, like the budget rule: the settings (`headroom-config`) read a ladder, the
//! driver counts its rungs, and the shim applies the one it is given. No I/O.

use std::ffi::OsString;

use serde::{Deserialize, Serialize};

/// One rung: edits applied to a compiler's arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rung {
    pub edits: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("flag ladder edit `{edit}` is not `PATTERN=REPLACEMENT` or `+FLAG` (for example `-g*=-g0`, `-O3=-O1`, `+-fno-var-tracking`)")]
pub struct RungError {
    edit: String,
}

impl Rung {
    /// Parses a rung from its edits, checking each.
    pub fn parse(edits: &[String]) -> Result<Rung, RungError> {
        for edit in edits {
            let valid = match edit.strip_prefix('+') {
                Some(flag) => !flag.is_empty(),
                None => edit
                    .split_once('=')
                    .is_some_and(|(pattern, _)| !pattern.is_empty()),
            };
            if !valid {
                return Err(RungError { edit: edit.clone() });
            }
        }
        Ok(Rung {
            edits: edits.to_vec(),
        })
    }

    /// How the report names this rung.
    pub fn describe(&self) -> String {
        self.edits.join(" ")
    }

    /// Applies the rung to `args` (the arguments after the compiler). Arguments that are not
    /// UTF-8 never match a pattern and pass through unchanged.
    pub fn apply(&self, args: &[OsString]) -> Vec<OsString> {
        let replacements: Vec<(&str, &str)> = self
            .edits
            .iter()
            .filter(|e| !e.starts_with('+'))
            .filter_map(|e| e.split_once('='))
            .collect();
        let mut out: Vec<OsString> = Vec::with_capacity(args.len());
        for arg in args {
            let replacement = arg
                .to_str()
                .and_then(|text| {
                    replacements
                        .iter()
                        .find(|(pattern, _)| matches(pattern, text))
                })
                .map(|(_, with)| *with);
            match replacement {
                Some("") => {}
                Some(with) => out.push(with.into()),
                None => out.push(arg.clone()),
            }
        }
        out.extend(
            self.edits
                .iter()
                .filter_map(|e| e.strip_prefix('+'))
                .map(OsString::from),
        );
        out
    }
}

fn matches(pattern: &str, arg: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => arg.starts_with(prefix),
        None => arg == pattern,
    }
}

/// The default ladder, in gcc's flags (for the compiler families that speak them, which
/// `headroom_govern::compiler` names): drop debug info, then optimise less, then the
/// low-memory settings install guides recommend.
pub fn default_ladder() -> Vec<Rung> {
    let rung = |edits: &[&str]| Rung {
        edits: edits.iter().map(|e| e.to_string()).collect(),
    };
    let no_debug = ["-g*=-g0"];
    let less_opt = ["-g*=-g0", "-O2=-O1", "-O3=-O1", "-Ofast=-O1"];
    let minimal = [
        "-g*=-g0",
        "-O*=-O0",
        "+-fno-var-tracking",
        "+--param",
        "+ggc-min-expand=20",
        "+--param",
        "+ggc-min-heapsize=32768",
    ];
    vec![rung(&no_debug), rung(&less_opt), rung(&minimal)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn args(text: &str) -> Vec<OsString> {
        text.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn each_default_rung_lowers_more() {
        let ladder = default_ladder();
        let original = args("-O3 -g -c a.cpp -o a.o");
        assert_eq!(ladder[0].apply(&original), args("-O3 -g0 -c a.cpp -o a.o"));
        assert_eq!(ladder[1].apply(&original), args("-O1 -g0 -c a.cpp -o a.o"));
        assert_eq!(
            ladder[2].apply(&original),
            args("-O0 -g0 -c a.cpp -o a.o -fno-var-tracking --param ggc-min-expand=20 --param ggc-min-heapsize=32768")
        );
    }

    #[test]
    fn non_utf8_arguments_pass_through_byte_for_byte() {
        let odd = OsString::from_vec(vec![b'-', b'g', 0xff]);
        let out = default_ladder()[0].apply(std::slice::from_ref(&odd));
        assert_eq!(out, vec![odd]);
    }

    #[test]
    fn removes_and_rejects() {
        let rung = Rung::parse(&["-flto=".into()]).unwrap();
        assert_eq!(rung.apply(&args("-flto -c")), args("-c"));
        assert!(Rung::parse(&["nonsense".into()]).is_err());
        assert!(Rung::parse(&["+".into()]).is_err());
    }
}
