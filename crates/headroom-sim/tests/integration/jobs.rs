//! Trace jobs the simulator's tests build their workloads from.

use headroom_sim::{JobKind, TraceJob};

/// A compile that ramps to `peak` over `duration` seconds, on one core.
pub fn ramp_job(label: &str, peak: u64, duration: f64) -> TraceJob {
    TraceJob {
        label: label.into(),
        group: "cc".into(),
        kind: JobKind::Compile,
        deps: Vec::new(),
        peak,
        duration,
        cpu: duration,
        profile: Vec::new(),
        input_bytes: None,
    }
}
