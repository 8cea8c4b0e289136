//! Which build a command shows: a build id from the history, a report JSON file, or the last
//! build that ran a job. `headroom report` shows it and `headroom sim import` replays it; one
//! function chooses for both, so that both take the same ids and files and say the same
//! things when they cannot.

use std::path::{Path, PathBuf};

use crate::{BuildReport, History, StoreError};

/// A build to show, with what the history knows of the governor that recorded it.
#[derive(Debug)]
pub struct Shown {
    pub report: BuildReport,
    /// The pid of the build's governor; `None` for a report file, or a build from before
    /// the history kept it.
    pub governor_pid: Option<u32>,
}

/// Why the build asked for cannot be shown.
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    #[error("cannot read the report {file}")]
    ReadReport {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{file} is not a report written by `headroom build --report` or `headroom report --json`"
    )]
    NotAReport {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "no build history at {} yet: run `headroom build -- …` first, or pass a report JSON file",
        .0.display()
    )]
    NoHistory(PathBuf),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The build `which` names: a build id from the history, or a JSON file written by
/// `headroom build --report` or `headroom report --json`; the last build that ran a job when
/// `None`.
pub fn load(which: Option<&str>) -> Result<Shown, ShowError> {
    let id = match which.map(|which| (which, which.parse::<i64>())) {
        Some((file, Err(_))) => return load_file(file),
        Some((_, Ok(id))) => Some(id),
        None => None,
    };
    let history = open_history()?;
    let id = match id {
        Some(id) => id,
        None => last_real_build(&history)?,
    };
    let report = history.load_build(id)?;
    let governor_pid = history.governor_pid(id)?;
    Ok(Shown {
        report,
        governor_pid,
    })
}

/// A report JSON file.
fn load_file(file: &str) -> Result<Shown, ShowError> {
    let text = std::fs::read_to_string(file).map_err(|source| ShowError::ReadReport {
        file: file.to_string(),
        source,
    })?;
    let report = serde_json::from_str(&text).map_err(|source| ShowError::NotAReport {
        file: file.to_string(),
        source,
    })?;
    Ok(Shown {
        report,
        governor_pid: None,
    })
}

/// The history at its default place, which must exist.
pub fn open_history() -> Result<History, ShowError> {
    let path = History::default_path();
    if !Path::new(&path).exists() {
        return Err(ShowError::NoHistory(path));
    }
    Ok(History::open(&path)?)
}

/// The last build that ran a job; a newer no-op rebuild is named but does not hide it. A newer
/// build with no end is shown: it may have run jobs its governor never recorded.
fn last_real_build(history: &History) -> Result<i64, StoreError> {
    let last = history.last_build_id()?;
    if history.load_build(last)?.build.duration_ms.is_none() {
        return Ok(last);
    }
    Ok(match history.last_build_with_jobs()? {
        Some(id) if id != last => {
            headroom_output::say!(
                "headroom: build {last}, the last one, ran no job (nothing to rebuild); \
                 showing build {id}, the last that did (`headroom report {last}` shows it)"
            );
            id
        }
        _ => last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_report_is_named_with_what_writes_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes.json");
        std::fs::write(&file, "{\"schema\": \"no\"}").unwrap();
        let err = load(file.to_str()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} is not a report written by `headroom build --report` or `headroom report --json`",
                file.display()
            )
        );
        let missing = dir.path().join("missing.json");
        let err = load(missing.to_str()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("cannot read the report {}", missing.display())
        );
    }
}
