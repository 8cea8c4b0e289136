//! How far the next job may stray, from how far recent ones did: the largest recent stray
//! plus a little. The timing slack of plans (how far a job's CPU time and pace move from its
//! profile) and the margin on a job's last peak (how far its peak moves between runs) are
//! both learned so. Strays keep their signs: their mean says where the peaks of a build lean
//! when they move together (the predictor's shift), and the margin is then taken around it.
//! Until enough strays are known, a configured value applies: the largest
//! of a few is a poor guess at the next one (a CI run failed on a build of six jobs, where
//! three that kept to their profiles narrowed the slack for the rest).

use std::collections::VecDeque;

/// Strays that count: enough to catch an outlier, few enough to follow a machine whose load
/// changes during the build.
pub(crate) const RECENT: usize = 32;
/// Strays needed before they replace the configured value: the next one goes further than
/// all of them with a chance of about 1 in 9.
pub(crate) const TRUSTED_AFTER: usize = 8;
/// Added to the largest stray seen, for jobs that stray a little more than the recent ones.
const MARGIN: f64 = 0.02;
/// Never more than this, so that one job starved of CPU for a while (its pace then says
/// nothing of the others) cannot make every plan hold every peak for most of its job's life;
/// jobs that stray further meet the safety net.
pub(crate) const MOST: f64 = 0.5;

#[derive(Debug, Clone)]
pub(crate) struct Strays {
    configured: f64,
    recent: VecDeque<f64>,
}

impl Strays {
    pub(crate) fn new(configured: f64) -> Self {
        Strays {
            configured,
            recent: VecDeque::with_capacity(RECENT),
        }
    }

    /// Notes one stray, as a fraction (0.03 = 3% more, -0.03 = 3% less).
    pub(crate) fn note(&mut self, stray: f64) {
        if !stray.is_finite() {
            return;
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(stray);
    }

    /// The largest recent stray either way plus a margin (at most [`MOST`]), or the
    /// configured value while fewer than [`TRUSTED_AFTER`] are known.
    pub(crate) fn get(&self) -> f64 {
        self.around(0.0)
    }

    /// Like [`Strays::get`], for strays measured from `center` instead of from 0.
    pub(crate) fn around(&self, center: f64) -> f64 {
        if !self.trusted() {
            return self.configured;
        }
        let largest = self
            .recent
            .iter()
            .map(|stray| (stray - center).abs())
            .fold(0.0, f64::max);
        (largest + MARGIN).min(MOST)
    }

    /// The mean of the recent strays with their signs: where they lean when they move
    /// together; 0 while fewer than [`TRUSTED_AFTER`] are known.
    pub(crate) fn mean(&self) -> f64 {
        if !self.trusted() {
            return 0.0;
        }
        self.recent.iter().sum::<f64>() / self.recent.len() as f64
    }

    /// Whether enough strays are known to go by.
    pub(crate) fn trusted(&self) -> bool {
        self.recent.len() >= TRUSTED_AFTER
    }
}
