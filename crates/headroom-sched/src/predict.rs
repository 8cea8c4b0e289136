//! Predicting a job's peak memory before it runs: from its own history when this exact job has
//! run before, else from jobs of the same group (same compiler and flags) seen in this build,
//! else from a conservative default.

use std::collections::HashMap;

/// Where a prediction came from, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredictionSource {
    /// This job's own recorded peak.
    History,
    /// The largest peak of finished jobs in the same group during this build.
    Group,
    /// Nothing known yet.
    Default,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    pub peak: u64,
    pub source: PredictionSource,
}

/// Learns peaks per group as jobs finish.
#[derive(Debug, Clone)]
pub struct Predictor {
    default_peak: u64,
    group_peaks: HashMap<u64, u64>,
}

/// Headroom added to a job's own history: the same translation unit varies by a few percent.
const HISTORY_MARGIN_PERCENT: u64 = 105;
/// Headroom added to a group estimate: other files of the group may be somewhat larger.
const GROUP_MARGIN_PERCENT: u64 = 115;

impl Predictor {
    pub fn new(default_peak: u64) -> Self {
        Predictor {
            default_peak,
            group_peaks: HashMap::new(),
        }
    }

    /// Predicts the peak of a job whose own recorded peak is `history`, in group `group`.
    pub fn predict(&self, history: Option<u64>, group: u64) -> Prediction {
        if let Some(peak) = history {
            return Prediction {
                peak: with_margin(peak, HISTORY_MARGIN_PERCENT),
                source: PredictionSource::History,
            };
        }
        match self.group_peaks.get(&group) {
            Some(&peak) => Prediction {
                peak: with_margin(peak, GROUP_MARGIN_PERCENT),
                source: PredictionSource::Group,
            },
            None => Prediction {
                peak: self.default_peak,
                source: PredictionSource::Default,
            },
        }
    }

    /// Records the measured peak of a finished job of `group`.
    pub fn learn(&mut self, group: u64, peak: u64) {
        let known = self.group_peaks.entry(group).or_insert(0);
        *known = (*known).max(peak);
    }
}

fn with_margin(bytes: u64, percent: u64) -> u64 {
    bytes.saturating_mul(percent) / 100
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_beats_group_beats_default() {
        let mut predictor = Predictor::new(1000);
        assert_eq!(
            predictor.predict(None, 7),
            Prediction {
                peak: 1000,
                source: PredictionSource::Default
            }
        );
        predictor.learn(7, 200);
        predictor.learn(7, 100);
        assert_eq!(
            predictor.predict(None, 7),
            Prediction {
                peak: 230,
                source: PredictionSource::Group
            }
        );
        assert_eq!(predictor.predict(None, 8).source, PredictionSource::Default);
        assert_eq!(
            predictor.predict(Some(400), 7),
            Prediction {
                peak: 420,
                source: PredictionSource::History
            }
        );
    }
}
