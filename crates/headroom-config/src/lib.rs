//! Settings from files: the project's `headroom.toml` (found in the working directory or a
//! parent) and the user's `~/.config/headroom/config.toml`. Flags and `HEADROOM_*` variables
//! (handled by clap) win over both; the project wins over the user. Merged in one place:
//! [`BuildSettings::merge`]. A library of its own so that the fuzz targets parse settings
//! exactly as the binary does.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

use headroom_farm::{EngineKind, Node};
use headroom_govern::budget::{parse_budget, BudgetSpec};
use headroom_govern::ladder::{default_ladder, Rung};

/// The name of the project settings file.
pub const PROJECT_FILE: &str = "headroom.toml";

/// One settings file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub build: BuildSection,
    #[serde(default)]
    pub kernels: KernelsSection,
}

/// Where a command finds its shared store's URL: its `--store` flag or variable (clap has
/// merged those), else `store` under its section of the project's `headroom.toml`, else of
/// the user's settings.
pub struct StoreSetting {
    /// What the store holds, for messages: `kernel`, `history`.
    what: &'static str,
    variable: &'static str,
    section: &'static str,
    in_section: fn(FileConfig) -> Option<String>,
}

/// `headroom kernels`' store.
pub const KERNEL_STORE: StoreSetting = StoreSetting {
    what: "kernel",
    variable: "HEADROOM_KERNEL_STORE",
    section: "kernels",
    in_section: |config| config.kernels.store,
};

/// `headroom history`'s store.
pub const HISTORY_STORE: StoreSetting = StoreSetting {
    what: "history",
    variable: "HEADROOM_HISTORY_STORE",
    section: "build",
    in_section: |config| config.build.store,
};

impl StoreSetting {
    /// The store's URL; none anywhere is an error that says where to set one.
    pub fn url(&self, flag: Option<&str>) -> Result<String> {
        if let Some(url) = flag {
            return Ok(url.to_string());
        }
        let project = FileConfig::find_project(&std::env::current_dir()?);
        for path in [project, headroom_paths::config_file()]
            .into_iter()
            .flatten()
        {
            if let Some(url) = (self.in_section)(FileConfig::load(&path)?) {
                return Ok(url);
            }
        }
        anyhow::bail!(
            "no {} store: give --store URL, set {}, or set `store` under [{}] in headroom.toml (s3://bucket/prefix, redis://host:port/db, webdav+https://host/path, file:///absolute/path)",
            self.what,
            self.variable,
            self.section
        )
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelsSection {
    /// Like `headroom kernels --store`: the shared kernel store's URL.
    pub store: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildSection {
    /// Like `--budget`: `6G`, `70%` or `auto`.
    pub budget: Option<String>,
    /// Like `--jobs`.
    pub jobs: Option<usize>,
    pub sample_interval_ms: Option<u64>,
    /// Start jobs off the build's longest path nicer (default true); like `--no-priorities`
    /// when false.
    pub priorities: Option<bool>,
    pub ladder: Option<LadderSection>,
    /// Like `headroom history --store`: the store that shares measured peaks between
    /// machines.
    pub store: Option<String>,
    /// The build farm jobs may be sent to.
    pub farm: Option<FarmSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FarmSection {
    /// The distributed compile engine, like `--farm-engine`: `distcc` (the default) or
    /// `sccache-dist`.
    pub engine: Option<String>,
    /// Like `--farm`: nodes as `HOST:PORT=MEMORY/SLOTS`.
    pub nodes: Option<Vec<String>>,
    /// Like `--farm-token`: the token sccache-dist's schedulers take from clients.
    pub token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LadderSection {
    /// Opt in to lower-memory flags for jobs that run out of memory alone.
    pub enabled: Option<bool>,
    /// Custom rungs, each a list of edits such as `"-g*=-g0"` or `"+-fno-var-tracking"`.
    pub rungs: Option<Vec<Vec<String>>>,
}

impl FileConfig {
    /// Reads `path`; a missing file is an empty configuration.
    pub fn load(path: &Path) -> Result<FileConfig> {
        match std::fs::read_to_string(path) {
            Ok(text) => FileConfig::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileConfig::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Parses the settings `text` of the file at `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<FileConfig> {
        toml::from_str(text).with_context(|| format!("invalid settings in {}", path.display()))
    }

    /// The nearest `headroom.toml` in `dir` or its parents.
    pub fn find_project(dir: &Path) -> Option<PathBuf> {
        dir.ancestors()
            .map(|d| d.join(PROJECT_FILE))
            .find(|p| p.is_file())
    }
}

/// The project's root: the nearest directory at or above `dir` that holds a `headroom.toml` or
/// a `.git`, else `dir` itself. Shared history writes paths under it as `$ROOT/…`, so that a
/// checkout elsewhere, on another machine, has the same keys; `headroom history` names the
/// project after it.
pub fn project_root(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|d| d.join(PROJECT_FILE).is_file() || d.join(".git").exists())
        .unwrap_or(dir)
        .to_path_buf()
}

/// What flags and environment variables said (clap has already merged those two).
#[derive(Debug, Default, Clone)]
pub struct BuildOverrides {
    pub budget: Option<String>,
    pub jobs: Option<usize>,
    pub lower_flags: bool,
    pub sample_interval_ms: Option<u64>,
    pub no_priorities: bool,
    /// `--farm` nodes; when given, they replace the files' nodes.
    pub farm: Vec<String>,
    pub farm_engine: Option<String>,
    pub farm_token: Option<String>,
    pub no_farm: bool,
}

/// The settings a build runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildSettings {
    pub budget: BudgetSpec,
    pub jobs: usize,
    pub ladder: Vec<Rung>,
    pub sample_interval_ms: u64,
    /// Whether jobs off the build's longest path start nicer.
    pub priorities: bool,
    /// The build farm's nodes; empty builds on this machine only.
    pub farm: Vec<Node>,
    /// The engine farm jobs go through.
    pub farm_engine: EngineKind,
    /// The token sccache-dist's schedulers take (empty where they take any).
    pub farm_token: String,
}

impl BuildSettings {
    /// Merges flags/env over the project file over the user file over the defaults.
    pub fn merge(
        flags: &BuildOverrides,
        project: &FileConfig,
        user: &FileConfig,
        cpus: usize,
    ) -> Result<Self> {
        let (project, user) = (&project.build, &user.build);
        let budget_text = flags
            .budget
            .as_ref()
            .or(project.budget.as_ref())
            .or(user.budget.as_ref());
        let budget = match budget_text {
            Some(text) => parse_budget(text)?,
            None => BudgetSpec::Auto,
        };
        let jobs = flags.jobs.or(project.jobs).or(user.jobs).unwrap_or(cpus);
        anyhow::ensure!(
            jobs > 0,
            "--jobs must be at least 1 (or leave it out to use the {cpus} CPUs)"
        );
        let (project_ladder, user_ladder) = (project.ladder.as_ref(), user.ladder.as_ref());
        let enabled = flags.lower_flags
            || project_ladder
                .and_then(|l| l.enabled)
                .or(user_ladder.and_then(|l| l.enabled))
                .unwrap_or(false);
        let custom = project_ladder
            .and_then(|l| l.rungs.as_ref())
            .or(user_ladder.and_then(|l| l.rungs.as_ref()));
        let ladder = match (enabled, custom) {
            (false, _) => Vec::new(),
            (true, None) => default_ladder(),
            (true, Some(rungs)) => rungs
                .iter()
                .map(|edits| Rung::parse(edits))
                .collect::<Result<_, _>>()?,
        };
        let sample_interval_ms = flags
            .sample_interval_ms
            .or(project.sample_interval_ms)
            .or(user.sample_interval_ms)
            .unwrap_or(100);
        let priorities =
            !flags.no_priorities && project.priorities.or(user.priorities).unwrap_or(true);
        let (project_farm, user_farm) = (project.farm.as_ref(), user.farm.as_ref());
        let farm_engine = farm_engine(flags, project_farm, user_farm)?;
        let farm_token = flags
            .farm_token
            .clone()
            .or_else(|| project_farm.and_then(|s| s.token.clone()))
            .or_else(|| user_farm.and_then(|s| s.token.clone()))
            .unwrap_or_default();
        Ok(BuildSettings {
            budget,
            jobs,
            ladder,
            sample_interval_ms,
            priorities,
            farm: farm_nodes(flags, project_farm, user_farm, farm_engine)?,
            farm_engine,
            farm_token,
        })
    }
}

/// The farm's engine: `--farm-engine` (or `HEADROOM_FARM_ENGINE`), else the project's
/// `[build.farm] engine`, else the user's, else distcc.
fn farm_engine(
    flags: &BuildOverrides,
    project: Option<&FarmSection>,
    user: Option<&FarmSection>,
) -> Result<EngineKind> {
    let from_files = [project, user]
        .into_iter()
        .flatten()
        .find_map(|section| section.engine.as_deref());
    let (name, place) = match (flags.farm_engine.as_deref(), from_files) {
        (Some(name), _) => (name, "--farm-engine"),
        (None, Some(name)) => (name, "[build.farm] engine"),
        (None, None) => return Ok(EngineKind::default()),
    };
    EngineKind::parse(name).ok_or_else(|| {
        anyhow::anyhow!(
            "{place} `{name}` is not an engine headroom supports: write {}",
            EngineKind::NAMES
        )
    })
}

/// The farm's nodes: `--farm` (or `HEADROOM_FARM`), else the project's `[build.farm]`, else
/// the user's; none with `--no-farm`.
fn farm_nodes(
    flags: &BuildOverrides,
    project: Option<&FarmSection>,
    user: Option<&FarmSection>,
    engine: EngineKind,
) -> Result<Vec<Node>> {
    if flags.no_farm {
        return Ok(Vec::new());
    }
    let texts = if flags.farm.is_empty() {
        project
            .and_then(|s| s.nodes.clone())
            .or_else(|| user.and_then(|s| s.nodes.clone()))
            .unwrap_or_default()
    } else {
        flags.farm.clone()
    };
    Ok(texts
        .iter()
        .map(|text| Node::parse(text, engine.default_port()))
        .collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn flags_beat_project_beats_user_beats_defaults() {
        let user = file("[build]\nbudget = \"4G\"\njobs = 3\n[build.ladder]\nenabled = true\n");
        let project = file("[build]\nbudget = \"50%\"\n");
        let none = BuildOverrides::default();
        let merged = BuildSettings::merge(&none, &project, &user, 8).unwrap();
        assert_eq!(merged.budget, BudgetSpec::Percent(50.0));
        assert_eq!(merged.jobs, 3);
        assert_eq!(merged.ladder, default_ladder());
        let flags = BuildOverrides {
            budget: Some("2G".into()),
            jobs: Some(1),
            ..Default::default()
        };
        let merged = BuildSettings::merge(&flags, &project, &user, 8).unwrap();
        assert_eq!(merged.budget, BudgetSpec::Bytes(2 << 30));
        assert_eq!(merged.jobs, 1);
        let defaults =
            BuildSettings::merge(&none, &FileConfig::default(), &FileConfig::default(), 8).unwrap();
        assert_eq!(
            defaults,
            BuildSettings {
                budget: BudgetSpec::Auto,
                jobs: 8,
                ladder: vec![],
                sample_interval_ms: 100,
                priorities: true,
                farm: vec![],
                farm_engine: EngineKind::Distcc,
                farm_token: String::new(),
            }
        );
    }

    #[test]
    fn priorities_are_on_unless_a_file_or_the_flag_turns_them_off() {
        let none = BuildOverrides::default();
        let off = file("[build]\npriorities = false\n");
        let on = file("[build]\npriorities = true\n");
        let merge = |flags: &BuildOverrides, project: &FileConfig, user: &FileConfig| {
            BuildSettings::merge(flags, project, user, 2)
                .unwrap()
                .priorities
        };
        assert!(merge(&none, &FileConfig::default(), &FileConfig::default()));
        assert!(!merge(&none, &FileConfig::default(), &off));
        assert!(merge(&none, &on, &off));
        let flag = BuildOverrides {
            no_priorities: true,
            ..Default::default()
        };
        assert!(!merge(&flag, &on, &on));
    }

    #[test]
    fn farm_nodes_come_from_flags_else_the_project_else_the_user() {
        let user = file("[build.farm]\nnodes = [\"user:3632=8G/4\"]\n");
        let project = file("[build.farm]\nengine = \"distcc\"\nnodes = [\"proj=16G/8\"]\n");
        let none = BuildOverrides::default();
        let nodes = |flags: &BuildOverrides, project: &FileConfig, user: &FileConfig| {
            BuildSettings::merge(flags, project, user, 2)
                .unwrap()
                .farm
                .iter()
                .map(|node| node.address.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(nodes(&none, &project, &user), ["proj:3632"]);
        assert_eq!(nodes(&none, &FileConfig::default(), &user), ["user:3632"]);
        let flags = BuildOverrides {
            farm: vec!["a:1=1G/1".into(), "b:2=2G/2".into()],
            ..Default::default()
        };
        assert_eq!(nodes(&flags, &project, &user), ["a:1", "b:2"]);
        let off = BuildOverrides {
            no_farm: true,
            ..flags
        };
        assert!(nodes(&off, &project, &user).is_empty());
        let icecream = file("[build.farm]\nengine = \"icecc\"\n");
        let err = BuildSettings::merge(&none, &icecream, &user, 2).unwrap_err();
        assert!(
            err.to_string().contains("[build.farm] engine `icecc`")
                && err.to_string().contains("sccache-dist"),
            "{err}"
        );
        let sccache = file(
            "[build.farm]\nengine = \"sccache-dist\"\ntoken = \"t\"\nnodes = [\"sched=64G/16\"]\n",
        );
        let settings = BuildSettings::merge(&none, &sccache, &user, 2).unwrap();
        assert_eq!(settings.farm_engine, EngineKind::SccacheDist);
        assert_eq!(settings.farm_token, "t");
        assert_eq!(
            settings.farm[0].address, "sched:10600",
            "the scheduler's port"
        );
        let flag_engine = BuildOverrides {
            farm_engine: Some("sccache-dist".into()),
            ..Default::default()
        };
        let settings = BuildSettings::merge(&flag_engine, &project, &user, 2).unwrap();
        assert_eq!(settings.farm[0].address, "proj:10600");
        let typo = BuildOverrides {
            farm_engine: Some("scache".into()),
            ..Default::default()
        };
        let err = BuildSettings::merge(&typo, &project, &user, 2).unwrap_err();
        assert!(err.to_string().contains("--farm-engine `scache`"), "{err}");
        let bad = BuildOverrides {
            farm: vec!["a:1=1G".into()],
            ..Default::default()
        };
        let err = BuildSettings::merge(&bad, &project, &user, 2).unwrap_err();
        assert!(err.to_string().contains("`a:1=1G`"), "{err}");
    }

    #[test]
    fn custom_rungs_are_checked() {
        let project =
            file("[build.ladder]\nenabled = true\nrungs = [[\"-g*=-g0\"], [\"bogus\"]]\n");
        let err = BuildSettings::merge(
            &BuildOverrides::default(),
            &project,
            &FileConfig::default(),
            2,
        )
        .unwrap_err();
        assert!(err.to_string().contains("`bogus`"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PROJECT_FILE);
        std::fs::write(&path, "[build]\nbudgett = \"6G\"\n").unwrap();
        let err = format!("{:#}", FileConfig::load(&path).unwrap_err());
        assert!(
            err.contains("headroom.toml") && err.contains("budgett"),
            "{err}"
        );
        let zero = BuildOverrides {
            jobs: Some(0),
            ..Default::default()
        };
        let err = BuildSettings::merge(&zero, &FileConfig::default(), &FileConfig::default(), 2)
            .unwrap_err();
        assert!(err.to_string().contains("--jobs"), "{err}");
    }
}
