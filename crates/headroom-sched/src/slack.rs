//! How far this build's jobs stray from their profiles, so admission over time plans with the
//! timing slack the machine really shows. A compiler given the same input repeats its CPU time
//! within a few percent on an idle machine, but a loaded machine slows its pace, and an edited
//! file may take longer: a fixed slack is either too tight for the one or wastes memory on
//! the other. Until enough jobs have shown how they stray, the configured slack applies: the
//! largest stray of a few jobs is a poor guess at the next one's (a CI run failed on a build
//! of six jobs, where three that kept to their profiles narrowed the slack for the rest).
//! A build can start from the strays of jobs that ran in the last two builds, which are the
//! same measure: how far a job strayed from its previous run.

use std::collections::VecDeque;

use crate::profile::{Profile, Ran};

/// Finished jobs whose strays count: enough to catch an outlier, few enough to follow a
/// machine whose load changes during the build.
const RECENT: usize = 32;
/// Finished jobs needed before their strays replace the configured slack: the next job
/// strays further than all of them with a chance of about 1 in 9.
const TRUSTED_AFTER: usize = 8;
/// Added to the largest stray seen, for jobs that stray a little more than the recent ones.
const MARGIN: f64 = 0.02;
/// The slack never goes above this, so that one job starved of CPU for a while (its pace
/// then says nothing of the others) cannot make the plan hold every peak for most of its
/// job's life; jobs that stray further meet the safety net.
const MOST: f64 = 0.5;

#[derive(Debug, Clone)]
pub(crate) struct TimingSlack {
    configured: f64,
    recent: VecDeque<f64>,
}

impl TimingSlack {
    pub(crate) fn new(configured: f64) -> Self {
        TimingSlack {
            configured,
            recent: VecDeque::with_capacity(RECENT),
        }
    }

    /// Notes how far a job that `ran` so strayed from the `profile` it was planned with.
    pub(crate) fn note(&mut self, profile: &Profile, ran: Ran) {
        let planned = Ran {
            cpu_seconds: profile.cpu_seconds(),
            wall_seconds: profile.wall_seconds(),
        };
        self.note_rerun(planned, ran);
    }

    /// Notes how far a job that `ran` so strayed from an earlier run that `planned` its
    /// profile: in CPU time (where along the profile its peak fell) and in pace (how fast it
    /// got there).
    pub(crate) fn note_rerun(&mut self, planned: Ran, ran: Ran) {
        let timed = |run: Ran| run.cpu_seconds > 0.0 && run.wall_seconds > 0.0;
        if !(timed(planned) && timed(ran)) {
            return;
        }
        let pace = |run: Ran| run.cpu_seconds / run.wall_seconds;
        let position = (ran.cpu_seconds / planned.cpu_seconds - 1.0).abs();
        let pace = (pace(ran) / pace(planned) - 1.0).abs();
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(position.max(pace));
    }

    /// The slack to plan with: the largest recent stray plus a margin, or the configured slack
    /// while fewer than [`TRUSTED_AFTER`] jobs have finished along a profile.
    pub(crate) fn get(&self) -> f64 {
        if self.recent.len() < TRUSTED_AFTER {
            return self.configured;
        }
        let largest = self.recent.iter().copied().fold(0.0, f64::max);
        (largest + MARGIN).min(MOST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::ran;

    fn profile() -> Profile {
        Profile::new(ran(100.0, 100.0), &[1, 4, 2]).unwrap()
    }

    #[test]
    fn follows_how_far_recent_jobs_strayed() {
        let mut slack = TimingSlack::new(0.2);
        for _ in 1..TRUSTED_AFTER {
            slack.note(&profile(), ran(103.0, 103.0));
        }
        assert_eq!(slack.get(), 0.2, "too few jobs to go by");
        slack.note(&profile(), ran(103.0, 103.0));
        assert!((slack.get() - 0.05).abs() < 1e-9, "{}", slack.get());
        // Half the pace on a loaded machine.
        slack.note(&profile(), ran(100.0, 200.0));
        assert!((slack.get() - 0.52_f64.min(MOST)).abs() < 1e-9);
        for _ in 0..RECENT {
            slack.note(&profile(), ran(99.0, 99.0));
        }
        assert!((slack.get() - 0.03).abs() < 1e-9, "{}", slack.get());
    }

    #[test]
    fn reruns_of_earlier_builds_count_like_finished_jobs() {
        let mut slack = TimingSlack::new(0.2);
        for _ in 0..TRUSTED_AFTER {
            slack.note_rerun(ran(50.0, 50.0), ran(51.0, 51.0));
        }
        assert!((slack.get() - 0.04).abs() < 1e-9, "{}", slack.get());
        slack.note_rerun(ran(0.0, 0.0), ran(51.0, 51.0));
        assert!(
            (slack.get() - 0.04).abs() < 1e-9,
            "an untimed run says nothing"
        );
    }

    #[test]
    fn a_run_with_no_time_says_nothing() {
        let mut slack = TimingSlack::new(0.2);
        for _ in 0..TRUSTED_AFTER {
            slack.note(&profile(), ran(0.0, 1.0));
        }
        assert_eq!(slack.get(), 0.2);
    }
}
