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
