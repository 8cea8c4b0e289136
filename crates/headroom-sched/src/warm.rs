//! What earlier builds teach the driver before this one starts: how far the same jobs'
//! peaks and times moved between two runs, and which jobs came together. The governor builds
//! it from its history and the simulator from a trace's earlier runs; both hand it to
//! [`crate::Driver::warm_start`], so a warm start is one thing in both.

use crate::bursts::Bursts;
use crate::profile::Ran;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct WarmStart {
    /// `(earlier, later)` peaks of the same jobs in two earlier runs, oldest later run first:
    /// the margin on peaks starts from how far they moved.
    pub peak_reruns: Vec<(u64, u64)>,
    /// `(earlier, later)` of what the same jobs ran, where both runs' times are known: the
    /// timing slack starts from how far they strayed.
    pub time_reruns: Vec<(Ran, Ran)>,
    /// Which jobs the newest build offered together.
    pub bursts: Bursts,
}

impl WarmStart {
    /// From pairs of runs known with both what they ran and their peak, as the history
    /// keeps them.
    pub fn from_reruns(
        reruns: impl IntoIterator<Item = ((Ran, u64), (Ran, u64))>,
        bursts: Bursts,
    ) -> Self {
        let (time_reruns, peak_reruns) = reruns
            .into_iter()
            .map(|((earlier_ran, earlier_peak), (later_ran, later_peak))| {
                ((earlier_ran, later_ran), (earlier_peak, later_peak))
            })
            .unzip();
        WarmStart {
            peak_reruns,
            time_reruns,
            bursts,
        }
    }
}
