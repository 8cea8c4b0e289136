//! Predicting a job's peak memory before it runs: from its own history when this exact job has
//! run before (on this machine, or on another that shared its history), else from jobs of the same group (same compiler and flags) finished in this
//! build, else from a conservative default. The first two come with the profile of the run
//! they came from, when one was recorded. A job's own peak gets a margin that follows how far
//! peaks moved between the last two runs of recently built jobs ([`crate::strays`]). When the
//! jobs of this build that finished show their peaks moved together from their last runs (an
//! edited header every unit includes, a newer compiler), the jobs still to come are predicted
//! with that shift.

use std::collections::{BTreeMap, HashMap};

use crate::policy::Estimate;
use crate::profile::Profile;
use crate::strays::Strays;
use crate::JobId;

/// Where a prediction came from, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredictionSource {
    /// This job's own recorded peak.
    History,
    /// This job's own peak as another machine measured it (shared history).
    Shared,
    /// The largest peak of finished jobs in the same group during this build, with that job's
    /// profile.
    Group,
    /// Nothing known yet.
    Default,
}

impl PredictionSource {
    /// As reports and logs name it: `history`, `shared`, `group`, `default`.
    pub fn name(self) -> &'static str {
        match self {
            PredictionSource::History => "history",
            PredictionSource::Shared => "shared",
            PredictionSource::Group => "group",
            PredictionSource::Default => "default",
        }
    }
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
    /// Measured on another machine and pulled from a shared store (`headroom history pull`),
    /// not by this one.
    pub shared: bool,
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
    /// How far peaks moved between the runs of jobs in two earlier builds: the margin on a
    /// job's own last peak until this build has `moves` enough.
    earlier_moves: Strays,
    /// How far the peaks of this build's finished jobs moved from their last runs, with signs:
    /// their mean is the shift, their spread around it the margin.
    moves: Strays,
    /// The shift that predictions from a job's own last run are made with now (0.1 = 10% up).
    shift: f64,
    /// Jobs predicted from their own last run that have not finished, with that run.
    from_history: BTreeMap<JobId, PastRun>,
}

/// Headroom added to a job's own last peak until earlier builds or this one show how far
/// peaks move between runs: the same translation unit varies by a few percent at most.
const HISTORY_MARGIN: f64 = 0.05;
/// Headroom added to a group estimate: other files of the group may be somewhat larger.
const GROUP_MARGIN: f64 = 0.15;
/// The shift follows this build's moves in steps of at least this much, so that noise in
/// their mean does not re-predict every waiting job at every finish.
const SHIFT_STEP: f64 = 0.02;

impl Predictor {
    pub fn new(default_peak: u64) -> Self {
        Predictor {
            default_peak,
            groups: HashMap::new(),
            waiting_for_group: HashMap::new(),
            earlier_moves: Strays::new(HISTORY_MARGIN),
            moves: Strays::new(HISTORY_MARGIN),
            shift: 0.0,
            from_history: BTreeMap::new(),
        }
    }

    /// Predicts jobs nothing is known of at `bytes` from now on (the budget or the slots it
    /// was a share of changed); jobs already predicted keep what they were given.
    pub fn set_default_peak(&mut self, bytes: u64) {
        self.default_peak = bytes;
    }

    /// Notes how far jobs' peaks moved between their runs in two earlier builds, as
    /// `(earlier peak, later peak)` in bytes, oldest later run first. A move counts against at
    /// least the default prediction (a slot's share of the budget): a small job whose peak
    /// moves by a few MiB matters to no budget and must not set the margin of large ones.
    pub fn note_peak_reruns(&mut self, peaks: impl IntoIterator<Item = (u64, u64)>) {
        for (earlier, later) in peaks {
            self.earlier_moves.note(self.moved(earlier, later));
        }
    }

    /// How far a peak moved from `earlier` to `later` bytes, against at least the default
    /// prediction.
    fn moved(&self, earlier: u64, later: u64) -> f64 {
        (later as f64 - earlier as f64) / earlier.max(self.default_peak) as f64
    }

    /// Predicts what job `id` of group `group` needs, given its own earlier run if there was
    /// one.
    pub fn predict(&mut self, id: JobId, history: Option<&PastRun>, group: u64) -> Prediction {
        if let Some(past) = history {
            self.from_history.insert(id, past.clone());
            return self.by_own_run(past);
        }
        match self.groups.get(&group) {
            Some(largest) => Prediction {
                estimate: group_estimate(largest),
                source: PredictionSource::Group,
            },
            None => {
                self.waiting_for_group.entry(group).or_default().push(id);
                Prediction {
                    estimate: Estimate {
                        learning_group: Some(group),
                        ..Estimate::flat(self.default_peak)
                    },
                    source: PredictionSource::Default,
                }
            }
        }
    }

    /// A job's prediction from its own last run: that run's peak moved by this build's shift,
    /// and the margin (this build's spread around the shift once known, else the earlier
    /// builds').
    fn by_own_run(&self, past: &PastRun) -> Prediction {
        let expected = grown(past.peak, self.shift);
        let margin = if self.moves.trusted() {
            self.moves.around(self.shift)
        } else {
            self.earlier_moves.get()
        };
        let peak = grown(expected, margin);
        Prediction {
            estimate: Estimate {
                peak,
                margin: peak - expected,
                profile: past.profile.clone(),
                waiting_seconds: 0.0,
                borrowed_profile: false,
                learning_group: None,
            },
            source: if past.shared {
                PredictionSource::Shared
            } else {
                PredictionSource::History
            },
        }
    }

    /// Records how finished job `id` of `group` ran, and returns better predictions for jobs
    /// predicted earlier (jobs that have gone since may be among them): for those of its group
    /// that got the default, and, when this build's peaks have moved together from their last
    /// runs, for every job predicted from its own.
    pub fn learn(&mut self, id: JobId, group: u64, run: PastRun) -> Vec<(JobId, Prediction)> {
        let mut better = self.note_own_run(id, run.peak);
        let largest = self.groups.entry(group).or_insert(PastRun {
            peak: 0,
            profile: None,
            shared: false,
        });
        if run.peak >= largest.peak {
            *largest = run;
        }
        let prediction = Prediction {
            estimate: group_estimate(largest),
            source: PredictionSource::Group,
        };
        let waiting = self.waiting_for_group.remove(&group).unwrap_or_default();
        better.extend(waiting.into_iter().map(|id| (id, prediction.clone())));
        better
    }

    /// Forgets a job that will not finish as predicted (it failed, or ran with lowered flags).
    pub fn forget(&mut self, id: JobId) {
        self.from_history.remove(&id);
    }

    /// Notes how far job `id`'s peak moved from its own last run, if it was predicted from it,
    /// and returns new predictions for the others when that moves the shift.
    fn note_own_run(&mut self, id: JobId, peak: u64) -> Vec<(JobId, Prediction)> {
        let Some(past) = self.from_history.remove(&id) else {
            return Vec::new();
        };
        self.moves.note(self.moved(past.peak, peak));
        if (self.moves.mean() - self.shift).abs() < SHIFT_STEP {
            return Vec::new();
        }
        self.shift = self.moves.mean();
        self.from_history
            .iter()
            .map(|(&id, past)| (id, self.by_own_run(past)))
            .collect()
    }
}

/// The largest finished job of a group, with a margin for other files of the group being
/// larger: a bias of the whole group, not a job's own stray, so it does not pool.
fn group_estimate(largest: &PastRun) -> Estimate {
    Estimate {
        peak: grown(largest.peak, GROUP_MARGIN),
        margin: 0,
        profile: largest.profile.clone(),
        waiting_seconds: 0.0,
        borrowed_profile: largest.profile.is_some(),
        learning_group: None,
    }
}

/// `bytes` and `fraction` more (0.05 = 5% more, -0.05 = 5% less).
fn grown(bytes: u64, fraction: f64) -> u64 {
    (bytes as f64 * (1.0 + fraction)).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A last run that peaked at 1000 MiB, with no profile.
    fn peak_of_1000_mib() -> PastRun {
        PastRun {
            peak: 1000 * MIB,
            profile: None,
            shared: false,
        }
    }

    #[test]
    fn history_beats_group_beats_default() {
        let mut predictor = Predictor::new(1000);
        assert_eq!(
            predictor.predict(1, None, 7),
            Prediction {
                estimate: Estimate {
                    learning_group: Some(7),
                    ..Estimate::flat(1000)
                },
                source: PredictionSource::Default
            }
        );
        predictor.predict(2, None, 8);
        // Job 1 was waiting on its group; job 2 is of another group.
        let run = |peak| PastRun {
            peak,
            profile: None,
            shared: false,
        };
        let from_group = Prediction {
            estimate: Estimate::flat(230),
            source: PredictionSource::Group,
        };
        assert_eq!(predictor.learn(10, 7, run(200)), vec![(1, from_group)]);
        assert_eq!(predictor.learn(11, 7, run(100)), vec![]);
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
        assert_eq!(predictor.learn(12, 8, run(50)).len(), 2);
        let profile = Profile::new(crate::profile::ran(10.0, 10.0), &[1, 4]);
        let past = PastRun {
            peak: 400,
            profile: profile.clone(),
            shared: false,
        };
        assert_eq!(
            predictor.predict(5, Some(&past), 7),
            Prediction {
                estimate: Estimate {
                    peak: 420,
                    margin: 20,
                    profile,
                    waiting_seconds: 0.0,
                    borrowed_profile: false,
                    learning_group: None,
                },
                source: PredictionSource::History
            }
        );
        // A group's estimate carries the profile of its largest finished job, borrowed.
        predictor.learn(13, 9, past);
        assert_eq!(
            predictor.predict(6, None, 9).estimate,
            Estimate {
                peak: 460,
                margin: 0,
                profile: Profile::new(crate::profile::ran(10.0, 10.0), &[1, 4]),
                waiting_seconds: 0.0,
                borrowed_profile: true,
                learning_group: None,
            }
        );
    }

    #[test]
    fn a_peak_another_machine_measured_predicts_like_our_own_and_says_so() {
        let mut predictor = Predictor::new(1000);
        let own = predictor.predict(1, Some(&peak_of_1000_mib()), 7);
        let shared = PastRun {
            shared: true,
            ..peak_of_1000_mib()
        };
        let from_shared = predictor.predict(2, Some(&shared), 7);
        assert_eq!(from_shared.estimate, own.estimate);
        assert_eq!(own.source, PredictionSource::History);
        assert_eq!(from_shared.source, PredictionSource::Shared);
        assert_eq!(from_shared.source.name(), "shared");
    }

    #[test]
    fn the_margin_on_a_jobs_own_peak_follows_how_far_peaks_moved_between_runs() {
        let past = peak_of_1000_mib();
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

    #[test]
    fn jobs_still_to_come_follow_peaks_that_moved_together() {
        let past = peak_of_1000_mib();
        let mut predictor = Predictor::new(256 * MIB);
        for id in 0..20 {
            predictor.predict(id, Some(&past), 0);
        }
        // Peaks that stray either way around their last runs move nothing.
        for id in 0..8 {
            let peak = if id % 2 == 0 { 1010 } else { 990 } * MIB;
            let run = PastRun {
                peak,
                profile: None,
                shared: false,
            };
            assert_eq!(predictor.learn(id, 0, run), vec![], "job {id}");
        }
        // An edited header: every unit now peaks 10% higher. The second such unit makes the
        // mean of the moves lean 2% up (0.2 / 10), and every job still to come is predicted
        // 2% up, with a margin of the largest move around that plus 2%: 8% + 2%.
        let grown_run = || PastRun {
            peak: 1100 * MIB,
            profile: None,
            shared: false,
        };
        assert_eq!(predictor.learn(8, 0, grown_run()), vec![]);
        let better = predictor.learn(9, 0, grown_run());
        let ids: Vec<JobId> = better.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, (10..20).collect::<Vec<_>>());
        let Prediction { estimate, source } = &better[0].1;
        assert_eq!(*source, PredictionSource::History);
        let expected = estimate.peak - estimate.margin;
        assert_eq!(expected, grown(1000 * MIB, 0.02));
        assert_eq!(estimate.peak, grown(expected, 0.1));
        // New offers get the shift too, and a failed job is forgotten.
        assert_eq!(
            predictor.predict(30, Some(&past), 0).estimate,
            estimate.clone()
        );
        predictor.forget(30);
        assert!(!predictor.from_history.contains_key(&30));
    }
}
