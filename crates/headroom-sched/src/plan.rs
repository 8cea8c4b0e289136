//! Admission over time: what the running jobs will need from now on, slice by slice of the
//! future, so that a job whose peak comes later may start beside jobs whose peaks will have
//! passed by then. Jobs without a profile reserve the same bytes for as long as they run,
//! which is the peak-per-job admission of a plain reservation.
//!
//! Each job's need carries a margin for how far it may stray from its last run. Jobs stray
//! independently of each other, so the margins of jobs planned together pool as the root of
//! the sum of their squares (as tolerances stack in engineering) instead of adding up: fifteen
//! units that each may need 5% more than last time will not all need it at once.

use crate::profile::Profile;

/// Slices of the future that a plan checks.
const PLAN_SLICES: usize = 64;

/// Bytes a job may need, of which `margin` allows for how far it may stray from its last run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Need {
    pub(crate) bytes: u64,
    pub(crate) margin: u64,
}

impl Need {
    /// The need of a job that already holds `floor` bytes: at least those, and no margin on
    /// what it surely holds.
    pub(crate) fn at_least(self, floor: u64) -> Need {
        let bytes = self.bytes.max(floor);
        Need {
            bytes,
            margin: self.margin.min(bytes - floor),
        }
    }

    /// The need of a job that can have no more than `cap` bytes (the whole budget).
    fn at_most(self, cap: u64) -> Need {
        let bytes = self.bytes.min(cap);
        Need {
            bytes,
            margin: self.margin.min(bytes),
        }
    }
}

/// What jobs planned together need: their expected bytes add up and their margins pool.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Total {
    expected: u64,
    margin_squares: f64,
}

impl Total {
    pub(crate) fn with(self, need: Need) -> Total {
        Total {
            expected: self.expected + (need.bytes - need.margin),
            margin_squares: self.margin_squares + (need.margin as f64).powi(2),
        }
    }

    pub(crate) fn bytes(self) -> u64 {
        self.expected + self.margin_squares.sqrt().ceil() as u64
    }
}

/// What one job is expected to need from now on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outlook<'a> {
    /// The same bytes for as long as it runs, however long that is: the job has no profile, or
    /// it is stopped, or it has outrun its profile.
    Flat(Need),
    /// The job follows its profile, scaled so the profile's peak is `peak`, from `progress`
    /// CPU seconds into its life, at the pace it had then, give or take `slack` (0.1 = 10%)
    /// in CPU time and pace; while it runs it needs at least `floor` bytes.
    Timed {
        profile: &'a Profile,
        progress: f64,
        peak: Need,
        floor: u64,
        slack: f64,
    },
}

impl Outlook<'_> {
    /// Seconds from now until the job has ended even if it needs its slack more CPU time than
    /// its profile (0 for a flat outlook, whose end is unknown).
    fn remaining(&self) -> f64 {
        match *self {
            Outlook::Flat(_) => 0.0,
            Outlook::Timed {
                profile,
                progress,
                slack,
                ..
            } => {
                let cpu_left = profile.cpu_seconds() * (1.0 + slack) - progress;
                (cpu_left / profile.cpu_per_second()).max(0.0)
            }
        }
    }

    /// The most bytes the job may need between `from` and `to` seconds from now, allowing it
    /// to run its slack faster or slower than its profile.
    fn highest_between(&self, from: f64, to: f64) -> Need {
        match *self {
            Outlook::Flat(need) => need,
            Outlook::Timed {
                profile,
                progress,
                peak,
                floor,
                slack,
            } => {
                let pace = profile.cpu_per_second();
                let earliest = (progress + from * pace) / (1.0 + slack);
                let latest = (progress + to * pace) * (1.0 + slack);
                if earliest >= profile.cpu_seconds() {
                    return Need::default();
                }
                let fraction = profile.highest_between(earliest, latest);
                let need = Need {
                    bytes: (fraction * peak.bytes as f64).ceil() as u64,
                    margin: (fraction * peak.margin as f64).floor() as u64,
                };
                need.at_least(floor)
            }
        }
    }
}

/// The bytes the admitted jobs may need in each slice of the future.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Seconds per slice.
    step: f64,
    /// What the planned jobs need in each slice.
    slices: Vec<Total>,
}

impl Plan {
    /// A plan long enough for the running jobs and for any of the `candidates` to end in.
    pub(crate) fn new<'a>(
        running: &[Outlook<'a>],
        candidates: impl Iterator<Item = Outlook<'a>>,
    ) -> Plan {
        let horizon = running
            .iter()
            .copied()
            .chain(candidates)
            .map(|outlook| outlook.remaining())
            .fold(0.0, f64::max);
        let mut plan = Plan {
            step: horizon / PLAN_SLICES as f64,
            slices: vec![Total::default(); PLAN_SLICES],
        };
        for outlook in running {
            plan.add(outlook);
        }
        plan
    }

    fn each_slice<'p>(&'p self, outlook: &'p Outlook<'_>) -> impl Iterator<Item = Need> + 'p {
        (0..PLAN_SLICES).map(move |slice| {
            let from = slice as f64 * self.step;
            outlook.highest_between(from, from + self.step)
        })
    }

    /// Whether `outlook` fits next to everything planned, in every slice, within `budget`.
    /// A job that needs more than the whole budget is planned at the budget: at its peak it
    /// has the budget to itself, which is all it can have, and it may still start in the last
    /// moments of others if its peak comes after they end (an nvcc job whose cicc peaks a
    /// fifth into its life, after the kernel before it).
    pub(crate) fn fits(&self, outlook: &Outlook<'_>, budget: u64) -> bool {
        self.slices
            .iter()
            .zip(self.each_slice(outlook))
            .all(|(planned, needed)| planned.with(needed.at_most(budget)).bytes() <= budget)
    }

    pub(crate) fn add(&mut self, outlook: &Outlook<'_>) {
        let needs: Vec<Need> = self.each_slice(outlook).collect();
        for (planned, needed) in self.slices.iter_mut().zip(needs) {
            *planned = planned.with(needed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::ran;

    const GB: u64 = 1_000_000_000;

    /// A 100 s job at 10% of its peak for 75 s, then at its peak.
    fn late_peak() -> Profile {
        let slices: Vec<u64> = (0..16).map(|i| if i < 12 { 1 } else { 10 }).collect();
        Profile::new(ran(100.0, 100.0), &slices).unwrap()
    }

    /// A 4 GB `late_peak` job `progress` seconds in, using at least `floor` bytes, with a
    /// slack of 10%.
    fn at(profile: &Profile, progress: f64, floor: u64) -> Outlook<'_> {
        Outlook::Timed {
            profile,
            progress,
            peak: Need {
                bytes: 4 * GB,
                margin: 0,
            },
            floor,
            slack: 0.1,
        }
    }

    fn flat(bytes: u64, margin: u64) -> Outlook<'static> {
        Outlook::Flat(Need { bytes, margin })
    }

    #[test]
    fn a_late_peak_fits_beside_a_job_that_will_have_ended() {
        let profile = late_peak();
        let candidate = at(&profile, 0.0, 0);
        let plan = Plan::new(&[at(&profile, 90.0, 4 * GB)], std::iter::once(candidate));
        // Flat reservations would need 8 GB; the running job ends long before the new one peaks.
        assert!(plan.fits(&candidate, 5 * GB));
        assert!(!plan.fits(&flat(4 * GB, 0), 5 * GB));
    }

    #[test]
    fn two_peaks_that_may_meet_do_not_fit() {
        let profile = late_peak();
        let candidate = at(&profile, 0.0, 0);
        let plan = Plan::new(&[at(&profile, 5.0, GB / 2)], std::iter::once(candidate));
        assert!(!plan.fits(&candidate, 5 * GB));
        assert!(plan.fits(&candidate, 8 * GB));
    }

    #[test]
    fn a_job_larger_than_the_budget_starts_if_its_peak_comes_after_the_others_end() {
        let profile = late_peak();
        let larger_than_the_budget = Outlook::Timed {
            profile: &profile,
            progress: 0.0,
            peak: Need {
                bytes: 6 * GB,
                margin: GB / 2,
            },
            floor: 0,
            slack: 0.1,
        };
        let candidates = || std::iter::once(larger_than_the_budget);
        // Ends within 20 s even at its slack, long before the new job peaks at 68 s or later.
        let ending = Plan::new(&[at(&profile, 90.0, 4 * GB)], candidates());
        assert!(ending.fits(&larger_than_the_budget, 5 * GB));
        // A job that may still run at the new one's peak, however little it then holds.
        let young = Plan::new(&[at(&profile, 5.0, GB / 2)], candidates());
        assert!(!young.fits(&larger_than_the_budget, 5 * GB));
    }

    #[test]
    fn a_job_past_its_expected_end_needs_nothing_later() {
        let profile = late_peak();
        let ended = at(&profile, 200.0, 0);
        assert_eq!(ended.highest_between(0.0, 1.0), Need::default());
        assert_eq!(ended.remaining(), 0.0);
    }

    #[test]
    fn margins_of_jobs_planned_together_pool() {
        // Nine 1 GB jobs that may each need 0.1 GB more: 9.3 GB together, not 9.9 GB.
        let mut plan = Plan::new(&[], std::iter::empty());
        for _ in 0..8 {
            plan.add(&flat(GB + GB / 10, GB / 10));
        }
        let ninth = flat(GB + GB / 10, GB / 10);
        assert!(plan.fits(&ninth, 9_300_000_000));
        assert!(!plan.fits(&ninth, 9_299_000_000));
        // One job alone keeps its whole margin; what a job surely holds carries none.
        let alone = Total::default().with(Need {
            bytes: GB + GB / 10,
            margin: GB / 10,
        });
        assert_eq!(alone.bytes(), GB + GB / 10);
        let held = Need {
            bytes: GB,
            margin: GB / 10,
        };
        assert_eq!(held.at_least(GB - GB / 20).margin, GB / 20);
        assert_eq!(
            held.at_least(2 * GB),
            Need {
                bytes: 2 * GB,
                margin: 0
            }
        );
    }
}
