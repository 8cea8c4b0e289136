//! Where headroom keeps its files, in one place. Each is an environment variable of
//! headroom's own, else the XDG base directory for its kind, else that directory's default
//! under `HOME` (the XDG Base Directory rules); an empty variable counts as unset.

use std::path::PathBuf;

pub mod atomic;
pub mod temp;

/// The history, the shim directory and the interceptor: `$HEADROOM_STATE_DIR`, else
/// `$XDG_STATE_HOME/headroom`, else `~/.local/state/headroom`, else (no `HOME`) a directory
/// under the temporary directory.
pub fn state_dir() -> PathBuf {
    place("HEADROOM_STATE_DIR", "XDG_STATE_HOME", ".local/state", None)
        .unwrap_or_else(|| std::env::temp_dir().join("headroom"))
}

/// The variable that names the user's settings file.
pub const CONFIG_VARIABLE: &str = "HEADROOM_CONFIG";

/// The user's settings file, and whether the user named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    pub path: PathBuf,
    /// Named by `$HEADROOM_CONFIG`: a file the user named must exist, where the default
    /// location may well be empty.
    pub named: bool,
}

/// The user's settings: `$HEADROOM_CONFIG`, else `$XDG_CONFIG_HOME/headroom/config.toml`, else
/// `~/.config/headroom/config.toml`; `None` without `HOME`.
pub fn config_file() -> Option<ConfigFile> {
    if let Some(path) = variable(CONFIG_VARIABLE) {
        return Some(ConfigFile { path, named: true });
    }
    place(
        CONFIG_VARIABLE,
        "XDG_CONFIG_HOME",
        ".config",
        Some("config.toml"),
    )
    .map(|path| ConfigFile { path, named: false })
}

/// The kernel cache: `$own_variable`, else `$XDG_CACHE_HOME/headroom/kernels`, else
/// `~/.cache/headroom/kernels`; `None` without `HOME`.
pub fn kernel_cache_dir(own_variable: &str) -> Option<PathBuf> {
    place(own_variable, "XDG_CACHE_HOME", ".cache", Some("kernels"))
}

/// The per-user directory for the governor's socket: `$XDG_RUNTIME_DIR/headroom`; `None`
/// without `XDG_RUNTIME_DIR`. There is no fallback of a predictable name in the shared
/// temporary directory: another local user could take it first (the session makes a private
/// directory of its own there instead).
pub fn runtime_dir() -> Option<PathBuf> {
    variable("XDG_RUNTIME_DIR").map(|runtime| runtime.join("headroom"))
}

/// `$own`, else `$xdg/headroom[/leaf]`, else `~/home_default/headroom[/leaf]`.
fn place(own: &str, xdg: &str, home_default: &str, leaf: Option<&str>) -> Option<PathBuf> {
    if let Some(path) = variable(own) {
        return Some(path);
    }
    let base = variable(xdg).or_else(|| variable("HOME").map(|home| home.join(home_default)))?;
    let dir = base.join("headroom");
    Some(leaf.map_or_else(|| dir.clone(), |leaf| dir.join(leaf)))
}

fn variable(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test, since the environment is the process's: each case sets what it reads.
    #[test]
    fn own_variable_then_xdg_then_home() {
        let clear = || {
            for name in [
                "HEADROOM_STATE_DIR",
                "XDG_STATE_HOME",
                "HEADROOM_CONFIG",
                "XDG_CONFIG_HOME",
                "HEADROOM_TEST_CACHE",
                "XDG_CACHE_HOME",
                "XDG_RUNTIME_DIR",
            ] {
                std::env::remove_var(name);
            }
        };
        clear();
        std::env::set_var("HOME", "/home/u");
        assert_eq!(state_dir(), PathBuf::from("/home/u/.local/state/headroom"));
        assert_eq!(
            config_file(),
            Some(ConfigFile {
                path: PathBuf::from("/home/u/.config/headroom/config.toml"),
                named: false
            })
        );
        assert_eq!(
            kernel_cache_dir("HEADROOM_TEST_CACHE"),
            Some(PathBuf::from("/home/u/.cache/headroom/kernels"))
        );
        assert_eq!(runtime_dir(), None);

        std::env::set_var("XDG_STATE_HOME", "/x/state");
        std::env::set_var("XDG_CACHE_HOME", "/x/cache");
        std::env::set_var("XDG_RUNTIME_DIR", "/run/user/1000");
        assert_eq!(state_dir(), PathBuf::from("/x/state/headroom"));
        assert_eq!(
            kernel_cache_dir("HEADROOM_TEST_CACHE"),
            Some(PathBuf::from("/x/cache/headroom/kernels"))
        );
        assert_eq!(
            runtime_dir(),
            Some(PathBuf::from("/run/user/1000/headroom"))
        );

        std::env::set_var("HEADROOM_CONFIG", "/mine.toml");
        assert_eq!(
            config_file(),
            Some(ConfigFile {
                path: PathBuf::from("/mine.toml"),
                named: true
            })
        );
        std::env::set_var("HEADROOM_STATE_DIR", "/mine");
        std::env::set_var("HEADROOM_TEST_CACHE", "");
        assert_eq!(state_dir(), PathBuf::from("/mine"));
        assert_eq!(
            kernel_cache_dir("HEADROOM_TEST_CACHE"),
            Some(PathBuf::from("/x/cache/headroom/kernels")),
            "an empty variable counts as unset"
        );

        clear();
        std::env::remove_var("HOME");
        assert_eq!(config_file(), None);
        assert_eq!(state_dir(), std::env::temp_dir().join("headroom"));
    }
}
