//! The mistakes in settings that headroom names itself: each says where the wrong value was
//! written (flag, variable, or file and line) and how to write it instead.

use std::path::PathBuf;

use headroom_sched::budget::BudgetSpecError;

use crate::origin::Origin;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("invalid {}: {problem}; write a size such as `6G`, a percentage of available memory such as `70%`, or `auto`", origin.with_value(value))]
    Budget {
        value: String,
        origin: Origin,
        problem: &'static str,
    },
    #[error("{variable} names {}, which does not exist: create that file, or unset {variable} to read the default user settings (~/.config/headroom/config.toml)", path.display())]
    MissingUserFile {
        variable: &'static str,
        path: PathBuf,
    },
}

/// What is wrong with a budget, in words that hold wherever it was written (the parser's own
/// messages name `--budget`).
pub(crate) fn budget_problem(err: &BudgetSpecError) -> &'static str {
    match err {
        BudgetSpecError::Percent(_) => "a percentage must be above 0 and at most 100",
        BudgetSpecError::Zero(_) => "no job fits in no memory",
        BudgetSpecError::Invalid(_) => "it is neither a size, a percentage nor `auto`",
    }
}
