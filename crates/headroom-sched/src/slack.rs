//! How far this build's jobs stray from their profiles, so admission over time plans with the
//! timing slack the machine really shows. A compiler given the same input repeats its CPU time
//! within a few percent on an idle machine, but a loaded machine slows its pace, and an edited
//! file may take longer: a fixed slack is either too tight for the one or wastes memory on
//! the other. Once enough jobs have shown how they stray ([`crate::strays`]), the slack follows
//! them; a build can start from the strays of jobs that ran in the last two builds, which are
//! the same measure: how far a job strayed from its previous run.

use crate::profile::{Profile, Ran};
use crate::strays::Strays;

#[derive(Debug, Clone)]
pub(crate) struct TimingSlack {
    strays: Strays,
}

impl TimingSlack {
    pub(crate) fn new(configured: f64) -> Self {
        TimingSlack {
            strays: Strays::new(configured),
        }
    }

    /// Notes how far a job that `ran` so strayed from the `profile` it was planned with.
    pub(crate) fn note(&mut self, profile: &Profile, ran: Ran) {
        self.note_rerun(profile.ran(), ran);
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
        let position = ran.cpu_seconds / planned.cpu_seconds - 1.0;
        let pace = pace(ran) / pace(planned) - 1.0;
        self.strays.note(position.abs().max(pace.abs()));
    }

    /// The slack to plan with (see [`Strays::get`]).
    pub(crate) fn get(&self) -> f64 {
        self.strays.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::ran;
    use crate::strays::{MOST, RECENT, TRUSTED_AFTER};

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
