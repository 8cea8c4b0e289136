//! Admission over time: what the running jobs will need from now on, slice by slice of the
//! future, so that a job whose peak comes later may start beside jobs whose peaks will have
//! passed by then. Jobs without a profile reserve the same bytes for as long as they run,
//! which is the peak-per-job admission of a plain reservation.

use crate::profile::Profile;

/// Slices of the future that a plan checks.
const PLAN_SLICES: usize = 64;

/// What one job is expected to need from now on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outlook<'a> {
    /// The same bytes for as long as it runs, however long that is: the job has no profile, or
    /// it is stopped, or it has outrun its profile.
    Flat(u64),
    /// The job follows its profile, scaled so the profile's peak is `peak` bytes, from
    /// `progress` CPU seconds into its life, at the pace it had then; while it runs it needs
    /// at least `floor` bytes.
    Timed {
        profile: &'a Profile,
        progress: f64,
        peak: u64,
        floor: u64,
    },
}

impl Outlook<'_> {
    /// Seconds from now until the job has ended even if it needs `slack` more CPU time than
    /// its profile (0 for a flat outlook, whose end is unknown).
    fn remaining(&self, slack: f64) -> f64 {
        match *self {
            Outlook::Flat(_) => 0.0,
            Outlook::Timed {
                profile, progress, ..
            } => {
                let cpu_left = profile.cpu_seconds() * (1.0 + slack) - progress;
                (cpu_left / profile.cpu_per_second()).max(0.0)
            }
        }
    }

    /// The most bytes the job may need between `from` and `to` seconds from now, allowing it
    /// to run `slack` faster or slower than its profile.
    fn highest_between(&self, from: f64, to: f64, slack: f64) -> u64 {
        match *self {
            Outlook::Flat(bytes) => bytes,
            Outlook::Timed {
                profile,
                progress,
                peak,
                floor,
            } => {
                let pace = profile.cpu_per_second();
                let earliest = (progress + from * pace) / (1.0 + slack);
                let latest = (progress + to * pace) * (1.0 + slack);
                if earliest >= profile.cpu_seconds() {
                    return 0;
                }
                let fraction = profile.highest_between(earliest, latest);
                ((fraction * peak as f64).ceil() as u64).max(floor)
            }
        }
    }
}

/// The bytes the admitted jobs may need in each slice of the future.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    slack: f64,
    /// Seconds per slice.
    step: f64,
    /// Bytes of the flat outlooks, needed in every slice.
    flat: u64,
    /// Bytes of the timed outlooks per slice.
    slices: Vec<u64>,
}

impl Plan {
    /// A plan long enough for the running jobs and for any of the `candidates` to end in.
    pub(crate) fn new<'a>(
        running: &[Outlook<'a>],
        candidates: impl Iterator<Item = Outlook<'a>>,
        slack: f64,
    ) -> Plan {
        let horizon = running
            .iter()
            .copied()
            .chain(candidates)
            .map(|outlook| outlook.remaining(slack))
            .fold(0.0, f64::max);
        let mut plan = Plan {
            slack,
            step: horizon / PLAN_SLICES as f64,
            flat: 0,
            slices: vec![0; PLAN_SLICES],
        };
        for outlook in running {
            plan.add(outlook);
        }
        plan
    }

    fn each_slice<'p>(&'p self, outlook: &'p Outlook<'_>) -> impl Iterator<Item = u64> + 'p {
        (0..PLAN_SLICES).map(move |slice| {
            let from = slice as f64 * self.step;
            outlook.highest_between(from, from + self.step, self.slack)
        })
    }

    /// Whether `outlook` fits next to everything planned, in every slice, within `budget`.
    pub(crate) fn fits(&self, outlook: &Outlook<'_>, budget: u64) -> bool {
        match *outlook {
            Outlook::Flat(bytes) => self.highest() + bytes <= budget,
            Outlook::Timed { .. } => self
                .slices
                .iter()
                .zip(self.each_slice(outlook))
                .all(|(&planned, needed)| self.flat + planned + needed <= budget),
        }
    }

    pub(crate) fn add(&mut self, outlook: &Outlook<'_>) {
        match *outlook {
            Outlook::Flat(bytes) => self.flat += bytes,
            Outlook::Timed { .. } => {
                let needs: Vec<u64> = self.each_slice(outlook).collect();
                for (planned, needed) in self.slices.iter_mut().zip(needs) {
                    *planned += needed;
                }
            }
        }
    }

    /// The most bytes planned in any slice.
    pub(crate) fn highest(&self) -> u64 {
        self.flat + self.slices.iter().copied().max().unwrap_or(0)
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

    /// A 4 GB `late_peak` job `progress` seconds in, using at least `floor` bytes.
    fn at(profile: &Profile, progress: f64, floor: u64) -> Outlook<'_> {
        Outlook::Timed {
            profile,
            progress,
            peak: 4 * GB,
            floor,
        }
    }

    #[test]
    fn a_late_peak_fits_beside_a_job_that_will_have_ended() {
        let profile = late_peak();
        let candidate = at(&profile, 0.0, 0);
        let plan = Plan::new(
            &[at(&profile, 90.0, 4 * GB)],
            std::iter::once(candidate),
            0.1,
        );
        // Flat reservations would need 8 GB; the running job ends long before the new one peaks.
        assert!(plan.fits(&candidate, 5 * GB));
        assert!(!plan.fits(&Outlook::Flat(4 * GB), 5 * GB));
    }

    #[test]
    fn two_peaks_that_may_meet_do_not_fit() {
        let profile = late_peak();
        let candidate = at(&profile, 0.0, 0);
        let plan = Plan::new(
            &[at(&profile, 5.0, GB / 2)],
            std::iter::once(candidate),
            0.1,
        );
        assert!(!plan.fits(&candidate, 5 * GB));
        assert!(plan.fits(&candidate, 8 * GB));
    }

    #[test]
    fn a_job_past_its_expected_end_needs_nothing_later() {
        let profile = late_peak();
        let ended = at(&profile, 200.0, 0);
        assert_eq!(ended.highest_between(0.0, 1.0, 0.1), 0);
        assert_eq!(ended.remaining(0.1), 0.0);
    }
}
