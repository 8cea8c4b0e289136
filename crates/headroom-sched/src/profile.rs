//! How a job's memory rises and falls over its life. A compiler is at its peak only for a
//! while (an nvcc job spends most of its life well below it), so jobs whose peaks do not
//! coincide can share memory that a peak-per-job reservation would keep idle. The governor
//! records each job's profile while it runs ([`ProfileRecorder`]); the next build plans
//! admission with it.
//!
//! A profile is laid out over the CPU time the job has used, not over wall time: a compiler
//! that gets half a core, or is stopped, is half as far along, and its CPU time says so.

/// Equal slices of a job's life that a profile keeps the highest use of.
pub const PROFILE_SLICES: usize = 64;

/// A job's memory over its life: the highest use in each of [`PROFILE_SLICES`] equal slices of
/// the CPU time it used, as fractions of its peak.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    cpu_seconds: f64,
    cpu_per_second: f64,
    shape: Vec<f32>,
}

/// What a job used over one run: CPU time, and wall time while it was not stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ran {
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
}

impl Profile {
    /// A profile of a job that `ran` so, with the given highest use per slice of its CPU time.
    /// `None` when the job used no CPU time or no memory that could be measured.
    pub fn new(ran: Ran, slices: &[u64]) -> Option<Profile> {
        let peak = slices.iter().copied().max().unwrap_or(0);
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(ran.cpu_seconds) || !positive(ran.wall_seconds) || peak == 0 {
            return None;
        }
        let shape = slices
            .iter()
            .map(|&bytes| (bytes as f64 / peak as f64) as f32)
            .collect();
        Some(Profile {
            cpu_seconds: ran.cpu_seconds,
            cpu_per_second: ran.cpu_seconds / ran.wall_seconds,
            shape,
        })
    }

    /// CPU seconds the job used.
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_seconds
    }

    /// CPU seconds the job used per second it ran: how fast it moves along its profile.
    pub fn cpu_per_second(&self) -> f64 {
        self.cpu_per_second
    }

    /// Wall seconds the job ran.
    pub fn wall_seconds(&self) -> f64 {
        self.cpu_seconds / self.cpu_per_second
    }

    /// How the run this profile comes from ran.
    pub fn ran(&self) -> Ran {
        Ran {
            cpu_seconds: self.cpu_seconds,
            wall_seconds: self.wall_seconds(),
        }
    }

    /// The highest use per slice, as fractions of the peak.
    pub fn shape(&self) -> &[f32] {
        &self.shape
    }

    /// CPU seconds into the job's life at which it first fell below `fraction` of its peak
    /// after reaching it: where its peak phase ends (its end when it never fell so).
    pub fn fell_below_peak_at(&self, fraction: f32) -> f64 {
        let slice = self.cpu_seconds / self.shape.len() as f64;
        let highest = self.shape.iter().copied().fold(0.0, f32::max);
        let peak = self
            .shape
            .iter()
            .position(|&used| used >= highest)
            .unwrap_or(0);
        self.shape[peak..]
            .iter()
            .position(|&used| used < fraction * highest)
            .map_or(self.cpu_seconds, |after| (peak + after) as f64 * slice)
    }

    /// Highest fraction of the peak used between `from` and `to` CPU seconds into the job's
    /// life; 0 when that span starts after the job's end.
    pub fn highest_between(&self, from: f64, to: f64) -> f64 {
        if from >= self.cpu_seconds {
            return 0.0;
        }
        let slice = self.cpu_seconds / self.shape.len() as f64;
        let first = (from.max(0.0) / slice) as usize;
        let last = ((to / slice) as usize).min(self.shape.len() - 1);
        self.shape[first.min(last)..=last]
            .iter()
            .fold(0.0, |high, &fraction| high.max(f64::from(fraction)))
    }
}

/// Builds a [`Profile`] from samples taken while a job runs, in constant memory whatever the
/// job's length: samples land in buckets of a fixed width, and when the buckets fill, pairs
/// merge and the width doubles.
#[derive(Debug, Clone)]
pub struct ProfileRecorder {
    width: f64,
    buckets: Vec<Option<u64>>,
}

/// Buckets kept before pairs merge: four times the profile's slices, so a bucket straddling a
/// slice's edge blurs that slice by little.
const RECORDER_BUCKETS: usize = 4 * PROFILE_SLICES;
/// Width of the first buckets in CPU seconds: fine enough for a job that sleeps or waits on
/// I/O for most of the 100 ms between the governor's samples.
const FIRST_WIDTH: f64 = 0.01;

impl Default for ProfileRecorder {
    fn default() -> Self {
        ProfileRecorder {
            width: FIRST_WIDTH,
            buckets: Vec::new(),
        }
    }
}

impl ProfileRecorder {
    /// Records that the job used `bytes` after `cpu_seconds` of CPU time.
    pub fn record(&mut self, cpu_seconds: f64, bytes: u64) {
        let seconds = cpu_seconds.max(0.0);
        while seconds >= self.width * RECORDER_BUCKETS as f64 {
            self.buckets = self
                .buckets
                .chunks(2)
                .map(|pair| pair.iter().flatten().copied().max())
                .collect();
            self.width *= 2.0;
        }
        let index = (seconds / self.width) as usize;
        if self.buckets.len() <= index {
            self.buckets.resize(index + 1, None);
        }
        let bucket = &mut self.buckets[index];
        *bucket = Some(bucket.map_or(bytes, |high| high.max(bytes)));
    }

    /// The profile of a job that `ran` so in all. A stretch with no sample takes the last use
    /// seen before it (the first sample's, at the start).
    pub fn finish(&self, ran: Ran) -> Option<Profile> {
        let seconds = ran.cpu_seconds;
        let first = self.buckets.iter().flatten().copied().next()?;
        let mut last = first;
        let filled: Vec<u64> = self
            .buckets
            .iter()
            .map(|bucket| {
                last = bucket.unwrap_or(last);
                last
            })
            .collect();
        let slice = seconds / PROFILE_SLICES as f64;
        let slices: Vec<u64> = (0..PROFILE_SLICES)
            .map(|index| {
                let from = (index as f64 * slice / self.width) as usize;
                let to = (((index + 1) as f64 * slice / self.width).ceil() as usize).max(from + 1);
                let from = from.min(filled.len() - 1);
                let to = to.min(filled.len()).max(from + 1);
                filled[from..to].iter().copied().max().unwrap_or(last)
            })
            .collect();
        Profile::new(ran, &slices)
    }
}

/// Shorthand for tests across the crate.
#[cfg(test)]
pub(crate) fn ran(cpu_seconds: f64, wall_seconds: f64) -> Ran {
    Ran {
        cpu_seconds,
        wall_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn highest_between_covers_every_slice_the_span_touches() {
        let slices: Vec<u64> = (1..=16).map(|i| if i == 13 { 40 } else { 10 }).collect();
        let profile = Profile::new(ran(16.0, 8.0), &slices).unwrap();
        assert_eq!(profile.cpu_per_second(), 2.0);
        assert_eq!(profile.wall_seconds(), 8.0);
        assert_eq!(profile.highest_between(0.0, 11.9), 0.25);
        assert_eq!(profile.highest_between(11.5, 12.1), 1.0);
        assert_eq!(profile.highest_between(12.9, 40.0), 1.0);
        assert_eq!(profile.highest_between(13.0, 40.0), 0.25);
        assert_eq!(profile.highest_between(16.0, 40.0), 0.0);
    }

    #[test]
    fn a_recorder_keeps_the_shape_of_a_long_job_in_constant_memory() {
        let mut recorder = ProfileRecorder::default();
        // 300 s sampled every 100 ms: rises to 4 GiB at 240 s, then falls to 1 GiB.
        let mut seconds = 0.0;
        while seconds < 300.0 {
            let bytes = if seconds < 240.0 {
                (seconds / 240.0 * 4e9) as u64
            } else {
                1_000_000_000
            };
            recorder.record(seconds, bytes);
            seconds += 0.1;
        }
        assert!(recorder.buckets.len() <= RECORDER_BUCKETS);
        let profile = recorder.finish(ran(300.0, 300.0)).unwrap();
        assert_eq!(profile.shape().len(), PROFILE_SLICES);
        let peak_slice = profile
            .shape()
            .iter()
            .position(|&fraction| fraction == 1.0)
            .unwrap();
        // The peak, at 4/5 of the job's life, falls in the slice that holds that moment.
        assert_eq!(peak_slice, PROFILE_SLICES * 4 / 5, "{:?}", profile.shape());
        assert!(profile.shape()[0] < 0.15);
        assert!((profile.shape()[PROFILE_SLICES - 1] - 0.25).abs() < 0.01);
    }

    #[test]
    fn no_samples_or_no_memory_make_no_profile() {
        assert_eq!(ProfileRecorder::default().finish(ran(10.0, 10.0)), None);
        let mut recorder = ProfileRecorder::default();
        recorder.record(0.5, 0);
        assert_eq!(recorder.finish(ran(1.0, 1.0)), None);
        assert_eq!(Profile::new(ran(0.0, 1.0), &[1, 2]), None);
        assert_eq!(Profile::new(ran(1.0, 0.0), &[1, 2]), None);
    }

    #[test]
    fn a_short_job_repeats_its_samples_across_slices() {
        let mut recorder = ProfileRecorder::default();
        recorder.record(0.1, 100);
        recorder.record(0.2, 200);
        let profile = recorder.finish(ran(0.3, 0.3)).unwrap();
        assert_eq!(profile.shape().len(), PROFILE_SLICES);
        assert!(profile.shape().iter().all(|&f| f == 0.5 || f == 1.0));
        assert_eq!(profile.shape()[PROFILE_SLICES - 1], 1.0);
    }
}
