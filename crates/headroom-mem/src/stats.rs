//! Counters with the names and shape of PyTorch's `torch.cuda.memory_stats()`, so dashboards
//! and habits built for PyTorch read headroom-mem's numbers without translation.

use std::collections::BTreeMap;

/// One counter: its current value, the peak since the last reset, and the running totals
/// of increases (`allocated`) and decreases (`freed`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

impl Stat {
    #[inline]
    fn increase(&mut self, amount: u64) {
        self.current += amount;
        self.allocated += amount;
        self.peak = self.peak.max(self.current);
    }

    #[inline]
    fn decrease(&mut self, amount: u64) {
        self.current -= amount;
        self.freed += amount;
    }
}

/// Which of PyTorch's two pools a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Requests up to `PoolConfig::small_size`, carved from small segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// The `segment_type` string of PyTorch snapshots.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// A counter split like PyTorch's `StatType`: `all`, `small_pool` and `large_pool`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray {
    pub all: Stat,
    pub small_pool: Stat,
    pub large_pool: Stat,
}

impl StatArray {
    fn pool_mut(&mut self, kind: PoolKind) -> &mut Stat {
        match kind {
            PoolKind::Small => &mut self.small_pool,
            PoolKind::Large => &mut self.large_pool,
        }
    }

    #[inline]
    pub(crate) fn increase(&mut self, kind: PoolKind, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(kind).increase(amount);
    }

    #[inline]
    pub(crate) fn decrease(&mut self, kind: PoolKind, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(kind).decrease(amount);
    }

    fn stats_mut(&mut self) -> [&mut Stat; 3] {
        [&mut self.all, &mut self.small_pool, &mut self.large_pool]
    }

    fn named(&self) -> [(&'static str, &Stat); 3] {
        [
            ("all", &self.all),
            ("small_pool", &self.small_pool),
            ("large_pool", &self.large_pool),
        ]
    }
}

/// The statistics of one memory tier of a pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Number of allocated blocks.
    pub allocation: StatArray,
    /// Number of segments reserved from the backend.
    pub segment: StatArray,
    /// Number of active blocks (allocated and not yet returned).
    pub active: StatArray,
    /// Number of free blocks inside segments that are split.
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (after rounding).
    pub allocated_bytes: StatArray,
    /// Bytes of segments reserved from the backend.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks. Frees complete at once here, so this equals `allocated_bytes`.
    pub active_bytes: StatArray,
    /// Bytes of free blocks inside split segments: cached memory that fragmentation holds.
    pub inactive_split_bytes: StatArray,
    /// Bytes the callers asked for (before rounding).
    pub requested_bytes: StatArray,
    /// Allocations that failed once and succeeded after the cache was released.
    pub num_alloc_retries: u64,
    /// Allocations that failed even after releasing the cache.
    pub num_ooms: u64,
    /// Segments reserved from the backend.
    pub num_device_alloc: u64,
    /// Segments released to the backend.
    pub num_device_free: u64,
}

impl MemoryStats {
    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// Flat `"allocated_bytes.all.current" -> value` map, the layout of PyTorch's
    /// `memory_stats()`.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        let mut map = BTreeMap::new();
        for (name, array) in self.arrays() {
            for (pool, stat) in array.named() {
                for (field, value) in [
                    ("current", stat.current),
                    ("peak", stat.peak),
                    ("allocated", stat.allocated),
                    ("freed", stat.freed),
                ] {
                    map.insert(format!("{name}.{pool}.{field}"), value);
                }
            }
        }
        map.insert("num_alloc_retries".into(), self.num_alloc_retries);
        map.insert("num_ooms".into(), self.num_ooms);
        map.insert("num_device_alloc".into(), self.num_device_alloc);
        map.insert("num_device_free".into(), self.num_device_free);
        map
    }

    /// One value by its PyTorch key, e.g. `"reserved_bytes.all.peak"`.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.to_map().get(key).copied()
    }

    fn each(&self, field: impl Fn(&Stat) -> u64) -> Counters {
        let mut counters = Counters::default();
        for (row, (_, array)) in counters.0.iter_mut().zip(self.arrays()) {
            *row = [
                field(&array.all),
                field(&array.small_pool),
                field(&array.large_pool),
            ];
        }
        counters
    }

    pub(crate) fn currents(&self) -> Counters {
        self.each(|stat| stat.current)
    }

    pub(crate) fn peaks(&self) -> Counters {
        self.each(|stat| stat.peak)
    }

    pub(crate) fn set_peaks(&mut self, peaks: &Counters) {
        for (array, row) in self.arrays_mut().into_iter().zip(peaks.0) {
            for (stat, peak) in array.stats_mut().into_iter().zip(row) {
                stat.peak = peak;
            }
        }
    }

    /// Adds `other`'s current values, running totals and event counts, not its peaks: the
    /// statistics of a tier whose blocks are divided among shards (peaks of a sum are not
    /// sums of peaks, so the pool tracks those itself).
    pub(crate) fn add_counts(&mut self, other: &MemoryStats) {
        for (array, (_, other_array)) in self.arrays_mut().into_iter().zip(other.arrays()) {
            for (stat, (_, other_stat)) in array.stats_mut().into_iter().zip(other_array.named()) {
                stat.current += other_stat.current;
                stat.allocated += other_stat.allocated;
                stat.freed += other_stat.freed;
            }
        }
        self.num_alloc_retries += other.num_alloc_retries;
        self.num_ooms += other.num_ooms;
        self.num_device_alloc += other.num_device_alloc;
        self.num_device_free += other.num_device_free;
    }

    /// Sets every peak to its current value (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            for stat in array.stats_mut() {
                stat.peak = stat.current;
            }
        }
    }

    /// Zeroes the running totals (`torch.cuda.reset_accumulated_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            for stat in array.stats_mut() {
                stat.allocated = 0;
                stat.freed = 0;
            }
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

/// One of the arrays whose counters the pool raises without its tier-wide lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    Allocation,
    InactiveSplit,
    AllocatedBytes,
    InactiveSplitBytes,
    RequestedBytes,
}

impl Counter {
    /// Position in [`MemoryStats::arrays`].
    fn index(self) -> usize {
        match self {
            Counter::Allocation => 0,
            Counter::InactiveSplit => 3,
            Counter::AllocatedBytes => 4,
            Counter::InactiveSplitBytes => 7,
            Counter::RequestedBytes => 8,
        }
    }
}

/// One number per counter that has a peak (nine arrays of `all`, `small_pool`, `large_pool`):
/// a tier's peaks, the sum of its shards' current values, or how far one shard may raise
/// its own counters without the tier-wide lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters([[u64; 3]; 9]);

impl Counters {
    fn zip(self, other: Counters, f: impl Fn(u64, u64) -> u64) -> Counters {
        let mut out = self;
        for (row, other_row) in out.0.iter_mut().zip(other.0) {
            for (value, other_value) in row.iter_mut().zip(other_row) {
                *value = f(*value, other_value);
            }
        }
        out
    }

    /// How many counters there are; [`Counters::get`] and [`Counters::set`] take `0..LEN`.
    pub(crate) const LEN: usize = 27;

    pub(crate) fn get(&self, counter: usize) -> u64 {
        self.0[counter / 3][counter % 3]
    }

    pub(crate) fn set(&mut self, counter: usize, value: u64) {
        self.0[counter / 3][counter % 3] = value;
    }

    pub(crate) fn plus(self, other: Counters) -> Counters {
        self.zip(other, |a, b| a + b)
    }

    pub(crate) fn minus(self, other: Counters) -> Counters {
        self.zip(other, |a, b| a - b)
    }

    pub(crate) fn max(self, other: Counters) -> Counters {
        self.zip(other, u64::max)
    }

    /// Whether every counter is at most the one in `other`.
    pub(crate) fn within(&self, other: &Counters) -> bool {
        let pairs = self.0.iter().flatten().zip(other.0.iter().flatten());
        pairs.into_iter().all(|(value, limit)| value <= limit)
    }

    /// Whether raising `counter` by `amount` in `kind` (and so in `all`) keeps `stats`
    /// within these limits.
    #[inline]
    pub(crate) fn permits(
        &self,
        stats: &MemoryStats,
        counter: Counter,
        kind: PoolKind,
        amount: u64,
    ) -> bool {
        let limits = &self.0[counter.index()];
        let array = match counter {
            Counter::Allocation => &stats.allocation,
            Counter::InactiveSplit => &stats.inactive_split,
            Counter::AllocatedBytes => &stats.allocated_bytes,
            Counter::InactiveSplitBytes => &stats.inactive_split_bytes,
            Counter::RequestedBytes => &stats.requested_bytes,
        };
        let (pool, pool_limit) = match kind {
            PoolKind::Small => (&array.small_pool, limits[1]),
            PoolKind::Large => (&array.large_pool, limits[2]),
        };
        array.all.current + amount <= limits[0] && pool.current + amount <= pool_limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_pytorch_names() {
        let mut stats = MemoryStats::default();
        stats.allocated_bytes.increase(PoolKind::Large, 4096);
        stats.allocated_bytes.decrease(PoolKind::Large, 1024);
        let map = stats.to_map();
        assert_eq!(map["allocated_bytes.all.current"], 3072);
        assert_eq!(map["allocated_bytes.large_pool.peak"], 4096);
        assert_eq!(map["allocated_bytes.all.freed"], 1024);
        assert_eq!(map["allocated_bytes.small_pool.allocated"], 0);
        assert!(map.contains_key("inactive_split_bytes.all.current"));
        assert_eq!(stats.get("num_ooms"), Some(0));
        assert_eq!(map.len(), 9 * 3 * 4 + 4);
    }

    #[test]
    fn allowances_limit_all_and_the_pool() {
        let mut stats = MemoryStats::default();
        stats.allocated_bytes.increase(PoolKind::Small, 4096);
        let mut allowance = stats.currents();
        // allocated_bytes: `all` and `small_pool` may reach 8 KiB.
        let all = Counter::AllocatedBytes.index() * 3;
        allowance.set(all, 8192);
        allowance.set(all + 1, 8192);
        let permits =
            |amount| allowance.permits(&stats, Counter::AllocatedBytes, PoolKind::Small, amount);
        assert!(permits(4096));
        assert!(!permits(4097));
        // The large pool has no room, however much `all` has.
        assert!(!allowance.permits(&stats, Counter::AllocatedBytes, PoolKind::Large, 1));
        assert!(stats.currents().within(&allowance));
        assert!(!allowance.within(&stats.currents()));
    }

    #[test]
    fn shard_counts_add_up_without_their_peaks() {
        let mut shard = MemoryStats::default();
        shard.requested_bytes.increase(PoolKind::Large, 100);
        shard.requested_bytes.decrease(PoolKind::Large, 40);
        shard.num_ooms = 1;
        let mut total = MemoryStats::default();
        total.add_counts(&shard);
        total.add_counts(&shard);
        let requested = total.requested_bytes.large_pool;
        assert_eq!(
            (requested.current, requested.allocated, requested.freed),
            (120, 200, 80)
        );
        assert_eq!(requested.peak, 0);
        assert_eq!(total.num_ooms, 2);
        total.set_peaks(&total.currents());
        assert_eq!(total.requested_bytes.all.peak, 120);
    }

    #[test]
    fn reset_peak_keeps_current() {
        let mut stats = MemoryStats::default();
        stats.requested_bytes.increase(PoolKind::Small, 100);
        stats.requested_bytes.decrease(PoolKind::Small, 60);
        stats.reset_peak();
        assert_eq!(stats.requested_bytes.all.peak, 40);
        stats.reset_accumulated();
        assert_eq!(stats.requested_bytes.all.allocated, 0);
        assert_eq!(stats.requested_bytes.all.current, 40);
    }
}
