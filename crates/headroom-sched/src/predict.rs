//! Predicting a job's peak memory before it runs: from its own history when this exact job has
//! run before, else from jobs of the same group (same compiler and flags) finished in this
//! build, else from a conservative default. The first two come with the profile of the run
//! they came from, when one was recorded. A job's own peak gets a margin that follows how far
//! peaks moved between the last two runs of recently built jobs ([`crate::strays`]).

use std::collections::HashMap;

use crate::policy::Estimate;
use crate::profile::Profile;
use crate::strays::Strays;
use crate::JobId;

/// Where a prediction came from, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredictionSource {
    /// This job's own recorded peak.
    History,
    /// The largest peak of finished jobs in the same group during this build, with that job's
    /// profile.
    Group,
    /// Nothing known yet.
    Default,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub estimate: Estimate,
    pub source: PredictionSource,
}

/// What an earlier run of the same job showed.
#[derive(Debug, Clone, PartialEq)]
pub struct PastRun {
    pub peak: u64,
    pub profile: Option<Profile>,
}

/// Learns peaks per group as jobs finish, and passes what it learns on to the jobs of that
/// group it could only give the default to.
#[derive(Debug, Clone)]
pub struct Predictor {
    default_peak: u64,
    /// The finished job with the largest peak of each group.
    groups: HashMap<u64, PastRun>,
    /// Jobs predicted by default, by group, until a job of their group finishes.
    waiting_for_group: HashMap<u64, Vec<JobId>>,
    /// The margin on a job's own last peak.
    history_margin: Strays,
}

/// Headroom added to a job's own last peak until earlier builds show how far peaks move
/// between runs: the same translation unit varies by a few percent at most.
const HISTORY_MARGIN: f64 = 0.05;
/// Headroom added to a group estimate: other files of the group may be somewhat larger.
const GROUP_MARGIN: f64 = 0.15;

impl Predictor {
    pub fn new(default_peak: u64) -> Self {
        Predictor {
            default_peak,
            groups: HashMap::new(),
            waiting_for_group: HashMap::new(),
            history_margin: Strays::new(HISTORY_MARGIN),
        }
    }

    /// Notes how far jobs' peaks moved between their runs in two earlier builds, as
    /// `(earlier peak, later peak)` in bytes, oldest later run first. A move counts against at
    /// least the default prediction (a slot's share of the budget): a small job whose peak
    /// moves by a few MiB matters to no budget and must not set the margin of large ones.
    pub fn note_peak_reruns(&mut self, peaks: impl IntoIterator<Item = (u64, u64)>) {
        for (earlier, later) in peaks {
            let moved = earlier.abs_diff(later) as f64 / earlier.max(self.default_peak) as f64;
            self.history_margin.note(moved);
        }
    }

    /// Predicts what job `id` of group `group` needs, given its own earlier run if there was
    /// one.
    pub fn predict(&mut self, id: JobId, history: Option<&PastRun>, group: u64) -> Prediction {
        if let Some(past) = history {
            let peak = with_margin(past.peak, self.history_margin.get());
            return Prediction {
                estimate: Estimate {
                    peak,
                    margin: peak - past.peak,
                    profile: past.profile.clone(),
                    waiting_seconds: 0.0,
                },
                source: PredictionSource::History,
            };
        }
        match self.groups.get(&group) {
            Some(largest) => Prediction {
                estimate: group_estimate(largest),
                source: PredictionSource::Group,
            },
            None => {
                self.waiting_for_group.entry(group).or_default().push(id);
                Prediction {
                    estimate: Estimate::flat(self.default_peak),
                    source: PredictionSource::Default,
                }
            }
        }
    }

    /// Records how a finished job of `group` ran, and returns the better estimate for each job
    /// of that group that was predicted by default (jobs that have gone since may be among
    /// them).
    pub fn learn(&mut self, group: u64, run: PastRun) -> Vec<(JobId, Estimate)> {
        let largest = self.groups.entry(group).or_insert(PastRun {
            peak: 0,
            profile: None,
        });
        if run.peak >= largest.peak {
            *largest = run;
        }
        let estimate = group_estimate(largest);
        self.waiting_for_group
            .remove(&group)
            .unwrap_or_default()
            .into_iter()
            .map(|id| (id, estimate.clone()))
            .collect()
    }
}

/// The largest finished job of a group, with a margin for other files of the group being
/// larger: a bias of the whole group, not a job's own stray, so it does not pool.
fn group_estimate(largest: &PastRun) -> Estimate {
    Estimate {
        peak: with_margin(largest.peak, GROUP_MARGIN),
        margin: 0,
        profile: largest.profile.clone(),
        waiting_seconds: 0.0,
    }
}

/// `bytes` and `fraction` more (0.05 = 5%).
fn with_margin(bytes: u64, fraction: f64) -> u64 {
    (bytes as f64 * (1.0 + fraction)).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_beats_group_beats_default() {
        let mut predictor = Predictor::new(1000);
        assert_eq!(
            predictor.predict(1, None, 7),
            Prediction {
                estimate: Estimate::flat(1000),
                source: PredictionSource::Default
            }
        );
        predictor.predict(2, None, 8);
        // Job 1 was waiting on its group; job 2 is of another group.
        let run = |peak| PastRun {
            peak,
            profile: None,
        };
        assert_eq!(predictor.learn(7, run(200)), vec![(1, Estimate::flat(230))]);
        assert_eq!(predictor.learn(7, run(100)), vec![]);
        assert_eq!(
            predictor.predict(3, None, 7),
            Prediction {
                estimate: Estimate::flat(230),
                source: PredictionSource::Group
            }
        );
        assert_eq!(
            predictor.predict(4, None, 8).source,
            PredictionSource::Default
        );
        assert_eq!(predictor.learn(8, run(50)).len(), 2);
        let profile = Profile::new(crate::profile::ran(10.0, 10.0), &[1, 4]);
        let past = PastRun {
            peak: 400,
            profile: profile.clone(),
        };
        assert_eq!(
            predictor.predict(5, Some(&past), 7),
            Prediction {
                estimate: Estimate {
                    peak: 420,
                    margin: 20,
                    profile,
                    waiting_seconds: 0.0
                },
                source: PredictionSource::History
            }
        );
        // A group's estimate carries the profile of its largest finished job.
        predictor.learn(9, past);
        assert_eq!(
            predictor.predict(6, None, 9).estimate,
            Estimate {
                peak: 460,
                margin: 0,
                profile: Profile::new(crate::profile::ran(10.0, 10.0), &[1, 4]),
                waiting_seconds: 0.0,
            }
        );
    }

    #[test]
    fn the_margin_on_a_jobs_own_peak_follows_how_far_peaks_moved_between_runs() {
        const MIB: u64 = 1 << 20;
        let past = PastRun {
            peak: 1000 * MIB,
            profile: None,
        };
        let mut predictor = Predictor::new(256 * MIB);
        let predicted =
            |predictor: &mut Predictor| predictor.predict(1, Some(&past), 0).estimate.peak;
        assert_eq!(
            predicted(&mut predictor),
            1050 * MIB,
            "5% until enough reruns are known"
        );
        // Seven units moved by 1%, and a 10 MiB link by 2 MiB: 20% of its own peak, but only
        // 0.8% of the 256 MiB default prediction.
        let unit = (1000 * MIB, 1010 * MIB);
        predictor.note_peak_reruns(vec![unit; 7].into_iter().chain([(10 * MIB, 12 * MIB)]));
        let margin = predicted(&mut predictor) as f64 / (1000 * MIB) as f64 - 1.0;
        assert!(
            (margin - 0.03).abs() < 1e-6,
            "largest move 1% + 2%: {margin}"
        );
    }
}
