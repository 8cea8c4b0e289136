//! Where a setting's value came from: a flag, a variable, a line of a settings file, or
//! headroom's default. A wrong value is only fixed quickly when its message says where it was
//! written, and `headroom doctor` names where the budget a build would use was set.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Set nowhere: headroom's default.
    Default,
    /// A command-line flag, such as `--budget`.
    Flag(&'static str),
    /// An environment variable, such as `HEADROOM_BUDGET`.
    Variable(&'static str),
    /// A key of a section of a settings file, such as `budget` under `[build]`, on a line
    /// (counted from 1).
    File {
        section: &'static str,
        key: &'static str,
        path: PathBuf,
        line: usize,
    },
}

impl Origin {
    /// `key` of `[section]`, written at `span` (byte offsets) of `text`, the file at `path`.
    pub fn in_file(
        section: &'static str,
        key: &'static str,
        path: PathBuf,
        text: &str,
        span: Range<usize>,
    ) -> Origin {
        let before = text.get(..span.start).unwrap_or(text);
        Origin::File {
            section,
            key,
            path,
            line: before.matches('\n').count() + 1,
        }
    }

    /// The text `value` as it was written here: `--budget `6Q``, `HEADROOM_BUDGET `6Q``,
    /// `` `budget = "6Q"` on line 3 of headroom.toml ``.
    pub fn with_value(&self, value: &str) -> String {
        match self {
            Origin::Default => format!("default `{value}`"),
            Origin::Flag(name) | Origin::Variable(name) => format!("{name} `{value}`"),
            Origin::File {
                key, path, line, ..
            } => {
                format!("`{key} = {value:?}` on line {line} of {}", path.display())
            }
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => write!(f, "headroom's default"),
            Origin::Flag(name) | Origin::Variable(name) => write!(f, "{name}"),
            Origin::File {
                section,
                key,
                path,
                line,
            } => write!(
                f,
                "`{key}` under [{section}] on line {line} of {}",
                path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_value_is_named_by_its_key_line_and_path() {
        let text = "# mine\n[build]\nbudget = \"six\"\n";
        let start = text.find("\"six\"").unwrap();
        let origin = Origin::in_file(
            "build",
            "budget",
            PathBuf::from("p/headroom.toml"),
            text,
            start..start + 5,
        );
        assert_eq!(
            origin.to_string(),
            "`budget` under [build] on line 3 of p/headroom.toml"
        );
        assert_eq!(
            origin.with_value("six"),
            "`budget = \"six\"` on line 3 of p/headroom.toml"
        );
        assert_eq!(
            Origin::Variable("HEADROOM_BUDGET").to_string(),
            "HEADROOM_BUDGET"
        );
    }
}
