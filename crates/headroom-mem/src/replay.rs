//! Runs a recorded allocation trace against any allocator configuration, so a pool setting
//! can be judged on the workload that hurt, not on a guess. Also holds the power-of-two bin
//! allocator that fragmentation numbers are compared against.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::buffer::Allocation;
use crate::layout::{Alignment, Scope};
use crate::pool::MemoryPool;
use crate::trace::{TraceAction, TraceEvent};

/// Something that can serve a replayed trace.
pub trait ReplayTarget {
    /// What an allocation returns; dropping or passing it to `free` releases it.
    type Handle;
    /// `None` when the allocator ran out of memory.
    fn allocate(&mut self, scope: Scope, bytes: u64) -> Option<Self::Handle>;
    fn free(&mut self, handle: Self::Handle);
    /// Bytes currently held from the device, across tiers.
    fn reserved_bytes(&self) -> u64;
}

impl<'pool> ReplayTarget for &'pool MemoryPool {
    type Handle = Allocation<'pool>;

    fn allocate(&mut self, scope: Scope, bytes: u64) -> Option<Allocation<'pool>> {
        self.allocate_bytes(bytes, scope, Alignment::DEFAULT).ok()
    }

    fn free(&mut self, handle: Allocation<'pool>) {
        handle.free();
    }

    fn reserved_bytes(&self) -> u64 {
        Scope::ALL
            .into_iter()
            .map(|scope| MemoryPool::reserved_bytes(self, scope))
            .sum()
    }
}

impl<T: ReplayTarget> ReplayTarget for &mut T {
    type Handle = T::Handle;

    fn allocate(&mut self, scope: Scope, bytes: u64) -> Option<T::Handle> {
        (**self).allocate(scope, bytes)
    }

    fn free(&mut self, handle: T::Handle) {
        (**self).free(handle)
    }

    fn reserved_bytes(&self) -> u64 {
        (**self).reserved_bytes()
    }
}

/// Power-of-two bins: every request is rounded up to a power of two (at least 512 bytes)
/// and served from a cache of blocks of exactly that size; nothing is split or coalesced.
/// The classic simple device allocator, and the baseline for fragmentation figures.
#[derive(Debug, Default)]
pub struct PowerOfTwoBins {
    cached: BTreeMap<u64, usize>,
    reserved: u64,
    device_allocations: u64,
}

impl PowerOfTwoBins {
    const MIN_BIN: u64 = 512;

    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks reserved from the device so far (each bin miss reserves one).
    pub fn device_allocations(&self) -> u64 {
        self.device_allocations
    }
}

impl ReplayTarget for PowerOfTwoBins {
    type Handle = u64;

    fn allocate(&mut self, _scope: Scope, bytes: u64) -> Option<u64> {
        let bin = bytes.max(Self::MIN_BIN).checked_next_power_of_two()?;
        match self.cached.get_mut(&bin) {
            Some(count) if *count > 0 => *count -= 1,
            _ => {
                self.reserved += bin;
                self.device_allocations += 1;
            }
        }
        Some(bin)
    }

    fn free(&mut self, bin: u64) {
        *self.cached.entry(bin).or_default() += 1;
    }

    fn reserved_bytes(&self) -> u64 {
        self.reserved
    }
}

/// What a replay measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayReport {
    pub allocations: u64,
    /// Allocations the target refused.
    pub ooms: u64,
    /// Largest sum of live requested bytes at any point of the trace.
    pub peak_requested: u64,
    /// Largest reserved bytes at any point of the trace.
    pub peak_reserved: u64,
    /// Allocations never freed by the end of the trace: leak candidates.
    pub live_at_end: u64,
    pub live_bytes_at_end: u64,
    /// Peak requested bytes per stage annotation.
    pub stage_peaks: BTreeMap<String, u64>,
}

impl ReplayReport {
    /// Reserved / peak requested: 1.0 means no byte was wasted at the peak.
    pub fn overhead_ratio(&self) -> f64 {
        if self.peak_requested == 0 {
            return 1.0;
        }
        self.peak_reserved as f64 / self.peak_requested as f64
    }
}

/// A trace that cannot be replayed as recorded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReplayError {
    #[error("event {index} frees address {address:#x}, which no earlier event allocated; the trace is truncated or out of order")]
    UnknownFree { index: usize, address: u64 },
    #[error("event {index} allocates address {address:#x}, which is already live; the trace lost a free")]
    DoubleAlloc { index: usize, address: u64 },
}

/// Replays the `Alloc`/`Free` events of `events` against `target`. Segment and OOM events
/// describe the recording allocator, not the workload, and are skipped.
pub fn replay<T: ReplayTarget>(
    events: &[TraceEvent],
    mut target: T,
) -> Result<ReplayReport, ReplayError> {
    let mut live: HashMap<u64, (T::Handle, u64)> = HashMap::new();
    let mut refused: HashSet<u64> = HashSet::new();
    let mut report = ReplayReport::default();
    let mut requested = 0u64;
    for (index, event) in events.iter().enumerate() {
        match event.action {
            TraceAction::Alloc => {
                if live.contains_key(&event.address) {
                    return Err(ReplayError::DoubleAlloc {
                        index,
                        address: event.address,
                    });
                }
                report.allocations += 1;
                let Some(handle) = target.allocate(event.scope, event.requested) else {
                    report.ooms += 1;
                    refused.insert(event.address);
                    continue;
                };
                live.insert(event.address, (handle, event.requested));
                requested += event.requested;
                report.peak_requested = report.peak_requested.max(requested);
                report.peak_reserved = report.peak_reserved.max(target.reserved_bytes());
                if let Some(stage) = &event.stage {
                    let peak = report.stage_peaks.entry(stage.to_string()).or_default();
                    *peak = (*peak).max(requested);
                }
            }
            TraceAction::Free => match live.remove(&event.address) {
                Some((handle, bytes)) => {
                    requested -= bytes;
                    target.free(handle);
                }
                None if refused.remove(&event.address) => {}
                None => {
                    return Err(ReplayError::UnknownFree {
                        index,
                        address: event.address,
                    })
                }
            },
            TraceAction::SegmentAlloc | TraceAction::SegmentFree | TraceAction::Oom => {}
        }
    }
    report.live_at_end = live.len() as u64;
    report.live_bytes_at_end = requested;
    for (_, (handle, _)) in live.drain() {
        target.free(handle);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceEvent;

    fn alloc(address: u64, bytes: u64) -> TraceEvent {
        TraceEvent::new(TraceAction::Alloc, address, bytes, None)
    }

    fn free(address: u64) -> TraceEvent {
        TraceEvent::new(TraceAction::Free, address, 0, None)
    }

    #[test]
    fn power_of_two_bins_round_and_reuse() {
        let events = [alloc(1, 600), free(1), alloc(2, 1000), alloc(3, 5000)];
        let report = replay(&events, PowerOfTwoBins::new()).unwrap();
        assert_eq!(report.peak_reserved, 1024 + 8192);
        assert_eq!(report.peak_requested, 6000);
        assert_eq!((report.live_at_end, report.live_bytes_at_end), (2, 6000));
    }

    #[test]
    fn malformed_traces_are_reported_with_their_index() {
        assert_eq!(
            replay(&[alloc(1, 8), free(2)], PowerOfTwoBins::new()),
            Err(ReplayError::UnknownFree {
                index: 1,
                address: 2
            })
        );
        assert_eq!(
            replay(&[alloc(1, 8), alloc(1, 8)], PowerOfTwoBins::new()),
            Err(ReplayError::DoubleAlloc {
                index: 1,
                address: 1
            })
        );
    }
}
