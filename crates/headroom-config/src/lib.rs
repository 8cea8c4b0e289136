//! Settings from files: the project's `headroom.toml` (found in the working directory or a
//! parent) and the user's `~/.config/headroom/config.toml`. Flags and `HEADROOM_*` variables
//! (handled by clap, except `HEADROOM_BUDGET`, read here so that messages can tell it from
//! `--budget`) win over both; the project wins over the user. Found and read in one place
//! ([`BuildSettings::load`], which `headroom build` and `headroom doctor` share) and merged in
//! one pure function ([`BuildSettings::merge`]). A library of its own so that the fuzz targets
//! parse settings exactly as the binary does.

mod error;
mod origin;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;
use toml::Spanned;

use headroom_farm::{EngineKind, Node};
use headroom_paths::{ConfigFile, CONFIG_VARIABLE};
use headroom_probe::room::MemoryFacts;
use headroom_sched::budget::{resolve, Budget, BudgetSpec};
use headroom_sched::ladder::{default_ladder, Rung};

pub use error::SettingsError;
pub use origin::Origin;

/// The name of the project settings file.
pub const PROJECT_FILE: &str = "headroom.toml";
/// The variable a budget may be given in, which `--budget` beats.
pub const BUDGET_VARIABLE: &str = "HEADROOM_BUDGET";

/// One settings file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub build: BuildSection,
    #[serde(default)]
    pub kernels: KernelsSection,
    /// The file this was read from (empty for none), to name it in messages.
    #[serde(skip)]
    path: PathBuf,
    /// Its text, to turn a value's byte offsets into the line that messages name.
    #[serde(skip)]
    text: String,
}

/// The settings files a command reads: the project's and the user's.
#[derive(Debug, Default)]
pub struct SettingsFiles {
    /// The nearest `headroom.toml` at or above the working directory; empty without one.
    pub project: FileConfig,
    /// `$HEADROOM_CONFIG`, else the XDG user settings file; empty where the default file does
    /// not exist.
    pub user: FileConfig,
}

impl SettingsFiles {
    /// Finds and reads the settings files of a command run in `cwd`. A file that does not
    /// parse is an error naming its line; so is a `HEADROOM_CONFIG` naming no file, since the
    /// user asked for settings that would otherwise be silently left out.
    pub fn read(cwd: &Path) -> Result<SettingsFiles> {
        let project = match FileConfig::find_project(cwd) {
            Some(path) => FileConfig::load(&path)?,
            None => FileConfig::default(),
        };
        let user = match headroom_paths::config_file() {
            Some(ConfigFile { path, named: true }) if !path.exists() => {
                return Err(SettingsError::MissingUserFile {
                    variable: CONFIG_VARIABLE,
                    path,
                }
                .into())
            }
            Some(ConfigFile { path, .. }) => FileConfig::load(&path)?,
            None => FileConfig::default(),
        };
        Ok(SettingsFiles { project, user })
    }
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
        let files = SettingsFiles::read(&std::env::current_dir()?)?;
        for file in [files.project, files.user] {
            if let Some(url) = (self.in_section)(file) {
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
    /// Like `--budget`: `6G`, `70%` or `auto`; where it was written, for messages.
    pub budget: Option<Spanned<String>>,
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
        let config: FileConfig = toml::from_str(text)
            .with_context(|| format!("invalid settings in {}", path.display()))?;
        Ok(FileConfig {
            path: path.to_path_buf(),
            text: text.to_string(),
            ..config
        })
    }

    /// The file this was read from; `None` for settings from no file.
    pub fn path(&self) -> Option<&Path> {
        (!self.path.as_os_str().is_empty()).then_some(self.path.as_path())
    }

    /// Where `key` of `[section]`, written at `value`'s place in this file, came from.
    fn origin<T>(&self, section: &'static str, key: &'static str, value: &Spanned<T>) -> Origin {
        Origin::in_file(section, key, self.path.clone(), &self.text, value.span())
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

/// What flags and environment variables said (clap has already merged those two, except for
/// the budget).
#[derive(Debug, Default, Clone)]
pub struct BuildOverrides {
    /// `--budget`.
    pub budget: Option<String>,
    /// `HEADROOM_BUDGET`, which `--budget` beats. [`BuildSettings::load`] reads it from the
    /// environment; clap does not, so that a bad value is blamed on the right one.
    pub budget_variable: Option<String>,
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
    /// Where the budget was set.
    pub budget_origin: Origin,
    /// The settings files these came from, the project's first.
    pub files: Vec<PathBuf>,
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

/// The settings of a governed session: the build's settings, and where its work runs.
/// `headroom_govern::start::start_session` starts a governor with them.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSettings {
    /// The directory the command runs in.
    pub cwd: PathBuf,
    /// The root of the project `cwd` is in, for the history's paths.
    pub project_root: PathBuf,
    pub build: BuildSettings,
}

/// The settings of a governed session for work run in the current directory, as
/// [`BuildSettings::load`] merges them. `headroom build`, `headroom kernels build` and
/// `headroom run` all begin here.
pub fn session_settings(overrides: &BuildOverrides) -> Result<SessionSettings> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let settings = BuildSettings::load(overrides, &cwd)?;
    Ok(settings.into_session(cwd))
}

impl BuildSettings {
    /// The settings a command run in `cwd` builds with: `flags`, then `HEADROOM_BUDGET`, then
    /// the settings files ([`SettingsFiles::read`]), merged by [`BuildSettings::merge`].
    /// `headroom build` and `headroom doctor` both call this, so that doctor reports what a
    /// build would use.
    pub fn load(flags: &BuildOverrides, cwd: &Path) -> Result<Self> {
        let files = SettingsFiles::read(cwd)?;
        let flags = BuildOverrides {
            budget_variable: std::env::var_os(BUDGET_VARIABLE)
                .filter(|value| !value.is_empty())
                .map(|value| value.to_string_lossy().into_owned()),
            ..flags.clone()
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::merge(&flags, &files.project, &files.user, cpus)
    }

    /// Merges flags/env over the project file over the user file over the defaults.
    pub fn merge(
        flags: &BuildOverrides,
        project_file: &FileConfig,
        user_file: &FileConfig,
        cpus: usize,
    ) -> Result<Self> {
        let (budget, budget_origin) = budget(flags, project_file, user_file)?;
        let (project, user) = (&project_file.build, &user_file.build);
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
            budget_origin,
            files: [project_file.path(), user_file.path()]
                .into_iter()
                .flatten()
                .map(Path::to_path_buf)
                .collect(),
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

impl BuildSettings {
    /// These settings for a session of work run in `cwd`.
    pub fn into_session(self, cwd: PathBuf) -> SessionSettings {
        SessionSettings {
            project_root: project_root(&cwd),
            cwd,
            build: self,
        }
    }

    /// The budget in bytes on a machine with `facts`, and how it was chosen, naming where it
    /// was set unless it is the default.
    pub fn resolve_budget(&self, facts: &MemoryFacts) -> Budget {
        let (room, room_source) = facts.room();
        let resolved = resolve(self.budget, room, &room_source);
        let origin = &self.budget_origin;
        let source = match self.budget {
            _ if *origin == Origin::Default => resolved.source,
            BudgetSpec::Bytes(_) => format!("set by {origin}"),
            BudgetSpec::Percent(percent) => format!("{percent}% of {room_source}, set by {origin}"),
            BudgetSpec::Auto => format!("{}, set to auto by {origin}", resolved.source),
        };
        Budget {
            bytes: resolved.bytes,
            source,
        }
    }
}

/// The budget and where it was set: `--budget`, else `HEADROOM_BUDGET`, else the project's
/// `[build] budget`, else the user's, else `auto`. A bad value names where it was written.
fn budget(
    flags: &BuildOverrides,
    project: &FileConfig,
    user: &FileConfig,
) -> Result<(BudgetSpec, Origin), SettingsError> {
    let given = flags
        .budget
        .as_ref()
        .map(|text| (text.as_str(), Origin::Flag("--budget")))
        .or_else(|| {
            let text = flags.budget_variable.as_ref()?;
            Some((text.as_str(), Origin::Variable(BUDGET_VARIABLE)))
        })
        .or_else(|| {
            [project, user].into_iter().find_map(|file| {
                let value = file.build.budget.as_ref()?;
                Some((
                    value.get_ref().as_str(),
                    file.origin("build", "budget", value),
                ))
            })
        });
    let Some((text, origin)) = given else {
        return Ok((BudgetSpec::Auto, Origin::Default));
    };
    match text.parse::<BudgetSpec>() {
        Ok(spec) => Ok((spec, origin)),
        Err(err) => Err(SettingsError::Budget {
            value: text.to_string(),
            origin,
            problem: error::budget_problem(&err),
        }),
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
        FileConfig::parse(text, Path::new("p/headroom.toml")).unwrap()
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
                budget_origin: Origin::Default,
                files: vec![],
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
    fn the_budget_says_where_it_was_set() {
        let user = file("[build]\nbudget = \"4G\"\n");
        let project = file("# ours\n[build]\njobs = 2\nbudget = \"50%\"\n");
        let none = FileConfig::default();
        let origin = |flags: &BuildOverrides, project: &FileConfig, user: &FileConfig| {
            BuildSettings::merge(flags, project, user, 2)
                .unwrap()
                .budget_origin
                .to_string()
        };
        let flags = BuildOverrides::default();
        assert_eq!(origin(&flags, &none, &none), "headroom's default");
        assert_eq!(
            origin(&flags, &none, &user),
            "`budget` under [build] on line 2 of p/headroom.toml"
        );
        assert_eq!(
            origin(&flags, &project, &user),
            "`budget` under [build] on line 4 of p/headroom.toml"
        );
        let variable = BuildOverrides {
            budget_variable: Some("3G".into()),
            ..Default::default()
        };
        assert_eq!(origin(&variable, &project, &user), "HEADROOM_BUDGET");
        let flag = BuildOverrides {
            budget: Some("2G".into()),
            ..variable
        };
        assert_eq!(origin(&flag, &project, &user), "--budget");
        let facts = MemoryFacts {
            mem_available: 8 << 30,
            cgroup: None,
        };
        let settings = BuildSettings::merge(&flags, &project, &user, 2).unwrap();
        let budget = settings.resolve_budget(&facts);
        assert_eq!(budget.bytes, 4 << 30);
        assert_eq!(
            budget.source,
            "50% of MemAvailable 8.00 GiB, set by `budget` under [build] on line 4 of p/headroom.toml"
        );
    }

    #[test]
    fn a_bad_budget_names_where_it_was_written_and_the_valid_forms() {
        let bad_file = file("[build]\n\nbudget = \"six\"\n");
        let none = FileConfig::default();
        let message = |flags: &BuildOverrides, project: &FileConfig| {
            BuildSettings::merge(flags, project, &none, 2)
                .unwrap_err()
                .to_string()
        };
        let flags = BuildOverrides::default();
        let err = message(&flags, &bad_file);
        assert!(
            err.starts_with(
                "invalid `budget = \"six\"` on line 3 of p/headroom.toml: it is neither"
            ) && err.contains("`6G`")
                && err.contains("`70%`")
                && err.contains("`auto`")
                && !err.contains("--budget"),
            "{err}"
        );
        let variable = BuildOverrides {
            budget_variable: Some("150%".into()),
            ..Default::default()
        };
        let err = message(&variable, &bad_file);
        assert!(
            err.starts_with("invalid HEADROOM_BUDGET `150%`: a percentage"),
            "{err}"
        );
        let flag = BuildOverrides {
            budget: Some("0".into()),
            ..variable
        };
        let err = message(&flag, &bad_file);
        assert!(
            err.starts_with("invalid --budget `0`: no job fits"),
            "{err}"
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
