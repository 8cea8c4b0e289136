//! How much memory a build may use out of the room a machine has: one rule for the live
//! governor, which measures the room (MemAvailable, cgroup room), and the simulator, whose
//! machines are that room. What the user asks for (`--budget`, `HEADROOM_BUDGET`, `budget =`
//! in a settings file) is read here too, as [`BudgetSpec`]'s `FromStr`, so every place a budget
//! is written accepts the same forms.

use std::str::FromStr;

use headroom_size::{parse_size, Size};

/// The smallest and largest reserve kept back from the automatic budget.
const RESERVE_MIN: u64 = 256 << 20;
const RESERVE_MAX: u64 = 2 << 30;

/// What the user asked for with `--budget`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetSpec {
    /// The room less a reserve for everything that is not a compiler (the build system, the
    /// page cache of fresh objects, the desktop), and for jobs that grow between two samples.
    Auto,
    Bytes(u64),
    /// A percentage of the room, no reserve.
    Percent(f64),
}

impl BudgetSpec {
    /// The budget in bytes out of `room`, the memory the machine can hand out.
    pub fn bytes(self, room: u64) -> u64 {
        match self {
            BudgetSpec::Bytes(bytes) => bytes,
            BudgetSpec::Percent(percent) => (room as f64 * percent / 100.0) as u64,
            // Never zero: a starved machine still runs one job at a time.
            BudgetSpec::Auto => room.saturating_sub(reserve_for(room)).max(RESERVE_MIN),
        }
    }
}

/// Why a text is not a budget; each message names the text and the forms that are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetSpecError {
    #[error("invalid --budget `{0}`: valid forms are `auto`, a size such as `6G`, `1.5GiB`, `800M`, or a percentage of available memory such as `70%`")]
    Invalid(String),
    #[error("invalid --budget `{0}`: the percentage must be above 0 and at most 100")]
    Percent(String),
    #[error("invalid --budget `{0}`: no job fits in no memory; give a size such as `6G`, or leave --budget out to use what is available")]
    Zero(String),
}

impl FromStr for BudgetSpec {
    type Err = BudgetSpecError;

    /// `auto`, a size (`6G`, `1.5GiB`) or a percentage of the room (`70%`).
    fn from_str(text: &str) -> Result<BudgetSpec, BudgetSpecError> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("auto") {
            return Ok(BudgetSpec::Auto);
        }
        if let Some(number) = text.strip_suffix('%') {
            let percent: f64 = number
                .trim()
                .parse()
                .map_err(|_| BudgetSpecError::Invalid(text.into()))?;
            if !(percent > 0.0 && percent <= 100.0) {
                return Err(BudgetSpecError::Percent(text.into()));
            }
            return Ok(BudgetSpec::Percent(percent));
        }
        match parse_size(text) {
            Ok(0) => Err(BudgetSpecError::Zero(text.into())),
            Ok(bytes) => Ok(BudgetSpec::Bytes(bytes)),
            Err(_) => Err(BudgetSpecError::Invalid(text.into())),
        }
    }
}

/// The reserve kept back from `room`: 10%, at least 256 MiB, at most 2 GiB.
pub fn reserve_for(room: u64) -> u64 {
    (room / 10).clamp(RESERVE_MIN, RESERVE_MAX)
}

/// The budget in bytes and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub source: String,
}

/// Turns the user's request into a budget out of `room`, the memory the machine can hand out
/// (`room_source` says what it was measured from, for the budget's description).
pub fn resolve(spec: BudgetSpec, room: u64, room_source: &str) -> Budget {
    let source = match spec {
        BudgetSpec::Bytes(bytes) => format!("--budget {}", Size(bytes)),
        BudgetSpec::Percent(percent) => format!("--budget {percent}% of {room_source}"),
        BudgetSpec::Auto => format!(
            "{room_source}, minus a reserve of {}",
            Size(reserve_for(room))
        ),
    };
    Budget {
        bytes: spec.bytes(room),
        source,
    }
}

/// What to assume for a job nothing is known about: a fair share of the budget per slot,
/// at least 512 MiB (a modest C++ unit), at most the budget.
pub fn default_job_peak(budget: u64, slots: usize) -> u64 {
    (budget / slots.max(1) as u64).clamp((512u64 << 20).min(budget), budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn parses_sizes_percentages_and_auto() {
        assert_eq!("6G".parse(), Ok(BudgetSpec::Bytes(6 * GIB)));
        assert_eq!(" 1.5GiB ".parse(), Ok(BudgetSpec::Bytes(3 * GIB / 2)));
        assert_eq!("70%".parse(), Ok(BudgetSpec::Percent(70.0)));
        assert_eq!("100%".parse(), Ok(BudgetSpec::Percent(100.0)));
        assert_eq!("AUTO".parse(), Ok(BudgetSpec::Auto));
        for bad in ["six", "0", "150%", "-3%", "0%", "%", "6Q", ""] {
            let err = bad.parse::<BudgetSpec>().unwrap_err().to_string();
            assert!(err.contains("--budget") && err.contains(bad), "{err}");
        }
        assert_eq!(
            "0M".parse::<BudgetSpec>(),
            Err(BudgetSpecError::Zero("0M".into()))
        );
        assert_eq!(
            "150%".parse::<BudgetSpec>(),
            Err(BudgetSpecError::Percent("150%".into()))
        );
        assert_eq!(
            "six".parse::<BudgetSpec>(),
            Err(BudgetSpecError::Invalid("six".into()))
        );
    }

    #[test]
    fn auto_keeps_a_tenth_back_between_256_mib_and_2_gib() {
        assert_eq!(BudgetSpec::Auto.bytes(20 * GIB), 18 * GIB);
        assert_eq!(BudgetSpec::Auto.bytes(32 * GIB), 30 * GIB);
        assert_eq!(BudgetSpec::Auto.bytes(500 * GIB), 498 * GIB);
        assert_eq!(BudgetSpec::Auto.bytes(2 * GIB), 2 * GIB - 256 * MIB);
        // A starved machine still gets room for one job.
        assert_eq!(BudgetSpec::Auto.bytes(100 * MIB), RESERVE_MIN);
    }

    #[test]
    fn sizes_and_percentages_keep_no_reserve() {
        assert_eq!(BudgetSpec::Bytes(6 * GIB).bytes(32 * GIB), 6 * GIB);
        assert_eq!(BudgetSpec::Percent(100.0).bytes(32 * GIB), 32 * GIB);
        assert_eq!(BudgetSpec::Percent(50.0).bytes(3 * GIB), 3 * GIB / 2);
    }

    #[test]
    fn a_resolved_budget_says_how_it_was_chosen() {
        let room = "cgroup limit 1.50 GiB with 0 B in use";
        let auto = resolve(BudgetSpec::Auto, 3 * GIB / 2, room);
        assert_eq!(auto.bytes, 3 * GIB / 2 - 256 * MIB);
        assert_eq!(auto.source, format!("{room}, minus a reserve of 256.0 MiB"));
        let half = resolve(BudgetSpec::Percent(50.0), 3 * GIB / 2, room);
        assert_eq!(half.bytes, 3 * GIB / 4);
        assert_eq!(half.source, format!("--budget 50% of {room}"));
        let fixed = resolve(BudgetSpec::Bytes(6 * GIB), GIB, room);
        assert_eq!(
            (fixed.bytes, fixed.source.as_str()),
            (6 * GIB, "--budget 6.00 GiB")
        );
    }

    #[test]
    fn unknown_jobs_get_a_fair_share() {
        assert_eq!(default_job_peak(16 * GIB, 8), 2 * GIB);
        assert_eq!(default_job_peak(GIB, 8), 512 * MIB);
        assert_eq!(default_job_peak(GIB / 4, 8), GIB / 4);
        assert_eq!(default_job_peak(30 * GIB, 16), 30 * GIB / 16);
    }
}
