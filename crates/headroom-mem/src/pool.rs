//! The caching pool: segments are reserved from a backend once and carved into blocks with
//! best-fit search, splitting and coalescing, in a small and a large pool like PyTorch's CUDA
//! caching allocator, so steady-state allocation never touches the device.
//!
//! Recently freed small blocks also wait in short exact-size lists before they are coalesced:
//! an exact size is a perfect fit, and it makes the common free-then-allocate-the-same-size
//! pattern a push and a pop. Those lists are merged back (coalesced) whenever a request
//! would otherwise reserve a new segment, and on [`MemoryPool::empty_cache`].
//!
//! # Threads
//!
//! One lock per tier serialised every thread, and its cache line moving between cores made
//! two threads slower than one. So each tier is split into `SHARDS` (16) shards, each a whole
//! pool of its own (block table, best-fit trees, recent lists, segments, statistics) behind
//! its own lock. A thread works in the shard its thread number picks, so threads on
//! different shards share no memory on the fast path. A block's id names its shard, so a
//! buffer may be freed on any thread: it goes back to the shard it came from.
//!
//! The fast path takes only the shard's lock: allocating a cached block of the thread's
//! shard (from a recent list, else by best fit and splitting) and returning a block to its
//! shard (into a recent list, else coalesced into the tree). Everything else (reserving
//! and releasing segments, out-of-memory retry, no-cache mode) and every reader that walks
//! the tables (`memory_stats`, `snapshot`, `fragmentation`, `empty_cache`,
//! `check_invariants`) takes the tier's lock and then the lock of every shard in use, in
//! index order, so it sees and may use every cached block of every shard: out-of-memory
//! retry releases the cached segments of all shards and may then take a cached block from
//! any of them. A thread never waits for the tier's lock while holding a shard's lock, so
//! the order cannot deadlock.
//!
//! A block's state in its shard's table is the same as with one lock: a block in a recent
//! list is `Recent`, with `requested` 0, and counted in `inactive_split` when its segment
//! is split; an allocated block carries its `requested` size for snapshots. What a shard
//! caches is bounded as before: at most `RECENT_DEPTH` blocks per size class, plus the
//! free blocks of its own segments, and `empty_cache` and the retry before an
//! out-of-memory error release all of it. The price of shards is that a segment cached in
//! one shard serves another shard only after such a release (or at the limit, when no new
//! segment fits); a pool used by one thread uses one shard and behaves exactly as before.
//!
//! # Exact statistics
//!
//! Current values and running totals are per shard and summed when read, so they are
//! exact. A peak is the maximum of a sum over shards, which no shard sees alone, so the
//! tier keeps the peaks under its lock, and each shard has an *allowance* per counter,
//! with the invariant: the allowances of a tier's shards sum to at most its peaks. The fast
//! path goes ahead only if every counter it raises stays within the shard's allowance (it
//! computes the exact change first; lowering a counter needs nothing). Then the tier's
//! total, the sum of shard values, stays at most the peak: no fast operation can make a
//! new peak, so the recorded peaks are exact. Any other operation takes the slow path:
//! under all the locks the tier's total is known, and the peaks are raised to the highest
//! total the operation passed through.
//!
//! The slow path then shares the allowances out again. Each shard remembers the highest
//! values its counters reached in slow operations (its high water: what it needs to run
//! its usual cycle on the fast path). Other shards keep at most their high water, and the
//! acting shard gets the rest; if that is below its own high water, the others keep only
//! their current values and forget their high water, so a shard whose thread is gone
//! cannot hold room for ever. In steady state threads free and allocate the same sizes,
//! the peaks cover what they hold together, and every thread runs on its allowance.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use crate::backend::{Backend, BackendError};
use crate::error::{AllocError, ConfigError, OutOfMemory};
use crate::layout::{align_up, Alignment, Scope};
use crate::stats::{Counter, Counters, MemoryStats, PoolKind};
use crate::trace::{
    BlockSnapshot, BlockState, Recorder, SegmentSnapshot, Snapshot, StageGuard, TraceAction,
};

/// How a [`MemoryPool`] rounds, groups and limits memory. The defaults are PyTorch's except
/// for `max_split_size` (128 MiB, PyTorch: unlimited) and `reclaim_on_miss` (on, PyTorch:
/// off), which together keep reserved memory within ~10% of the peak under changing shapes
/// (see BENCHMARKS.md); [`PoolConfig::pytorch`] gives PyTorch's settings. One difference
/// in every configuration: when no new segment can be reserved, a request may take a cached
/// block of the other pool (small or large) where PyTorch raises out-of-memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Granularity and minimum size of every block, and the alignment every buffer gets
    /// without asking (a power of two; PyTorch: 512).
    pub block_size: u64,
    /// Requests up to this size use the small pool (PyTorch: 1 MiB).
    pub small_size: u64,
    /// Segment size of the small pool (PyTorch: 2 MiB).
    pub small_segment: u64,
    /// Requests up to this size share medium segments (PyTorch: 10 MiB)...
    pub medium_limit: u64,
    /// ...of this size (PyTorch: 20 MiB).
    pub medium_segment: u64,
    /// Larger requests get their own segment, rounded up to this (PyTorch: 2 MiB).
    pub large_round: u64,
    /// Blocks at least this large are "oversize": smaller requests never split them (so a
    /// small tensor cannot pin a huge segment), and larger requests take one only when it
    /// wastes less than `medium_segment` (PyTorch's `max_split_size_mb`). `None`: unlimited.
    pub max_split_size: Option<u64>,
    /// Most bytes the pool may reserve per tier; `None` means up to the backend's capacity.
    pub max_size: Option<u64>,
    /// `false` gives every request its own segment and releases it on free (PyTorch's
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`): the no-cache baseline, and a leak hunter's mode.
    pub caching: bool,
    /// Record every allocation, free, segment and OOM event for snapshots and replays.
    pub record_trace: bool,
    /// When a large request fits no cached block, release the cached large segments that
    /// are wholly free before reserving a new one (they are all too small for it). Keeps
    /// reserved memory close to the peak under changing shapes; steady-state loops never
    /// miss, so they keep their cache. PyTorch keeps them (like setting this to `false`).
    pub reclaim_on_miss: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            block_size: 512,
            small_size: 1 << 20,
            small_segment: 2 << 20,
            medium_limit: 10 << 20,
            medium_segment: 20 << 20,
            large_round: 2 << 20,
            max_split_size: Some(128 << 20),
            max_size: None,
            caching: true,
            record_trace: false,
            reclaim_on_miss: true,
        }
    }
}

impl PoolConfig {
    /// PyTorch's caching allocator defaults: no oversize limit, cached segments kept on a miss.
    pub fn pytorch() -> Self {
        PoolConfig {
            max_split_size: None,
            reclaim_on_miss: false,
            ..Self::default()
        }
    }

    /// The no-cache baseline: every allocation goes to the backend.
    pub fn no_cache() -> Self {
        PoolConfig {
            caching: false,
            ..Self::default()
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !self.block_size.is_power_of_two() || self.block_size < 8 {
            return Err(ConfigError::BlockSize(self.block_size));
        }
        for (name, value) in [
            ("small_size", self.small_size),
            ("small_segment", self.small_segment),
            ("medium_segment", self.medium_segment),
            ("large_round", self.large_round),
        ] {
            if value == 0 || value % self.block_size != 0 {
                return Err(ConfigError::NotMultiple {
                    name,
                    value,
                    block_size: self.block_size,
                });
            }
        }
        if self.small_size > self.small_segment {
            return Err(ConfigError::SmallSegment {
                small_size: self.small_size,
                small_segment: self.small_segment,
            });
        }
        Ok(())
    }
}

/// A block: its shard in the high [`SHARD_BITS`] bits, its index in that shard's table below.
/// Inside a shard's table, links and trees hold bare indices.
pub(crate) type BlockId = u32;
const NONE: BlockId = BlockId::MAX;
/// Shards per tier: enough for one per thread of a typical data loader or server.
const SHARDS: usize = 16;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();
const INDEX_BITS: u32 = BlockId::BITS - SHARD_BITS;
/// How many blocks of one exact size wait uncoalesced.
const RECENT_DEPTH: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the best-fit tree.
    Free,
    /// In an exact-size recent list, not coalesced yet.
    Recent,
    Allocated,
    /// Slot unused.
    Dead,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    address: u64,
    size: u64,
    requested: u64,
    prev: BlockId,
    next: BlockId,
    state: State,
    kind: PoolKind,
}

impl Block {
    fn is_split(&self) -> bool {
        self.prev != NONE || self.next != NONE
    }
}

/// Free blocks ordered for best fit: smallest size first, then lowest address.
type FreeTree = BTreeSet<(u64, u64, BlockId)>;

/// The blocks of one tier.
#[derive(Debug, Default)]
struct TierState {
    blocks: Vec<Block>,
    dead_slots: Vec<BlockId>,
    free_small: FreeTree,
    free_large: FreeTree,
    /// `recent[size / block_size - 1]`: freed small blocks of exactly that size.
    recent: Vec<Vec<BlockId>>,
    recent_count: usize,
    stats: MemoryStats,
}

/// Where a new allocation was placed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    pub block: BlockId,
    pub address: u64,
}

/// One shard of a tier: its blocks, and how far it may raise each counter on its own.
/// Aligned so that no two shards' hot fields share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    tier: TierState,
    allowance: Counters,
    /// The highest values this shard's counters reached in slow operations: what it
    /// needs to run its usual cycle on the fast path. Forgotten when another shard needs
    /// the room.
    high_water: Counters,
}

/// What a tier's lock guards: the peaks of the whole tier, and which shards hold blocks.
#[derive(Debug, Default)]
struct TierPeaks {
    peaks: Counters,
    /// Bit `i`: shard `i` has been used. Changes only under this lock.
    in_use: u32,
}

#[derive(Debug)]
struct Tier {
    peaks: Mutex<TierPeaks>,
    /// [`SHARDS`] of them, on the heap: together they are tens of kilobytes.
    shards: Box<[Mutex<Shard>; SHARDS]>,
}

/// A caching allocator over one backend, with one set of pools per memory tier.
#[derive(Debug)]
pub struct MemoryPool {
    backend: Arc<dyn Backend>,
    config: PoolConfig,
    tiers: [Tier; 3],
    recorder: Option<Recorder>,
}

/// How many live threads work in each shard.
static SHARD_HOLDERS: [AtomicUsize; SHARDS] = [const { AtomicUsize::new(0) }; SHARDS];

/// A thread's claim on its shard, given back when the thread exits, so threads that come
/// and go one after another keep using one shard (and its cached blocks) rather than
/// spreading cached memory over every shard.
struct ShardLease(usize);

impl Drop for ShardLease {
    fn drop(&mut self) {
        SHARD_HOLDERS[self.0].fetch_sub(1, Ordering::Relaxed);
    }
}

/// The shard the calling thread works in: on its first allocation, the shard with the
/// fewest live threads (the lowest such). The choice only balances load: a block records
/// its shard, so any thread may free it.
#[inline]
fn thread_shard() -> usize {
    thread_local! {
        // A constant initialiser: no lazy-init check on every call.
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
        static LEASE: Cell<Option<ShardLease>> = const { Cell::new(None) };
    }
    SHARD.with(|shard| {
        if shard.get() == usize::MAX {
            let least_held = (0..SHARDS)
                .min_by_key(|&index| SHARD_HOLDERS[index].load(Ordering::Relaxed))
                .unwrap_or(0);
            SHARD_HOLDERS[least_held].fetch_add(1, Ordering::Relaxed);
            LEASE.with(|lease| lease.set(Some(ShardLease(least_held))));
            shard.set(least_held);
        }
        shard.get()
    })
}

/// Whether the allowance covers a change of `(count, bytes)` in inactive_split that first
/// lowers and then raises it (so the highest value it passes is the end or the start).
fn inactive_split_allowed(
    allowance: &Counters,
    stats: &MemoryStats,
    kind: PoolKind,
    (count, bytes): (i64, i64),
) -> bool {
    (count <= 0 || allowance.permits(stats, Counter::InactiveSplit, kind, count as u64))
        && (bytes <= 0 || allowance.permits(stats, Counter::InactiveSplitBytes, kind, bytes as u64))
}

fn block_id(shard: usize, index: BlockId) -> BlockId {
    debug_assert!(index < 1 << INDEX_BITS, "block table overflow");
    ((shard as BlockId) << INDEX_BITS) | index
}

fn shard_and_index(id: BlockId) -> (usize, BlockId) {
    ((id >> INDEX_BITS) as usize, id & ((1 << INDEX_BITS) - 1))
}

/// A whole tier locked: its peaks and every shard in use. Operations on a shard go through
/// [`World::in_shard`], which keeps the peaks and the allowances right.
struct World<'a> {
    peaks: MutexGuard<'a, TierPeaks>,
    shards: SmallVec<[(usize, MutexGuard<'a, Shard>); 4]>,
}

impl World<'_> {
    fn shard_indices(&self) -> SmallVec<[usize; 4]> {
        self.shards.iter().map(|(index, _)| *index).collect()
    }

    fn position(&self, shard: usize) -> usize {
        self.shards
            .iter()
            .position(|(index, _)| *index == shard)
            .expect("the shard is in use")
    }

    /// The sum of every shard's current values.
    fn currents(&self) -> Counters {
        self.shards
            .iter()
            .fold(Counters::default(), |sum, (_, shard)| {
                sum.plus(shard.tier.stats.currents())
            })
    }

    /// Runs `operation` on one shard's blocks; it gets the bytes the other shards reserve.
    /// Afterwards the tier's peaks cover every total the operation passed through (the
    /// others stand still meanwhile, so that is theirs plus this shard's own peak during
    /// it), and the allowances are shared out again.
    fn in_shard<R>(&mut self, shard: usize, operation: impl FnOnce(&mut TierState, u64) -> R) -> R {
        let position = self.position(shard);
        let others = self
            .currents()
            .minus(self.shards[position].1.tier.stats.currents());
        let reserved_elsewhere = self
            .shards
            .iter()
            .filter(|(index, _)| *index != shard)
            .map(|(_, other)| other.tier.stats.reserved_bytes.all.current)
            .sum();
        let target = &mut self.shards[position].1;
        target.tier.stats.reset_peak();
        let result = operation(&mut target.tier, reserved_elsewhere);
        let passed = target.tier.stats.peaks();
        target.high_water = target.high_water.max(passed);
        self.peaks.peaks = self.peaks.peaks.max(others.plus(passed));
        self.share_allowances(position);
        result
    }

    /// Gives the shard at `acting` (which just left the fast path) room to run, keeping
    /// the allowances' sum equal to the peaks. Counter by counter: other shards keep at
    /// most what they have needed (their high water or current value); the acting shard
    /// gets the rest. When that is less than its own high water, the others keep only
    /// their current values and forget their high water, so a shard whose thread has
    /// gone cannot hold room forever and a new thread gets room to run.
    fn share_allowances(&mut self, acting: usize) {
        let peaks = self.peaks.peaks;
        let currents: SmallVec<[Counters; 4]> = self
            .shards
            .iter()
            .map(|(_, shard)| shard.tier.stats.currents())
            .collect();
        let mut acting_allowance = Counters::default();
        for counter in 0..Counters::LEN {
            let needed = self.shards[acting].1.high_water.get(counter);
            let mut kept_by_others = 0;
            for (position, (_, shard)) in self.shards.iter_mut().enumerate() {
                if position != acting {
                    let needs = shard
                        .high_water
                        .get(counter)
                        .max(currents[position].get(counter));
                    let kept = shard.allowance.get(counter).min(needs);
                    shard.allowance.set(counter, kept);
                    kept_by_others += kept;
                }
            }
            if peaks.get(counter) - kept_by_others < needed {
                kept_by_others = 0;
                for (position, (_, shard)) in self.shards.iter_mut().enumerate() {
                    if position != acting {
                        let current = currents[position].get(counter);
                        shard.allowance.set(counter, current);
                        shard.high_water.set(counter, current);
                        kept_by_others += current;
                    }
                }
            }
            acting_allowance.set(counter, peaks.get(counter) - kept_by_others);
        }
        self.shards[acting].1.allowance = acting_allowance;
    }

    /// The merged statistics of the tier, with its peaks.
    fn stats(&self) -> MemoryStats {
        let mut stats = MemoryStats::default();
        for (_, shard) in &self.shards {
            stats.add_counts(&shard.tier.stats);
        }
        stats.set_peaks(&self.peaks.peaks);
        stats
    }

    fn largest_free(&self) -> u64 {
        self.shards
            .iter()
            .map(|(_, shard)| shard.tier.largest_free())
            .max()
            .unwrap_or(0)
    }
}

impl MemoryPool {
    /// A pool with PyTorch's default settings.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_config(backend, PoolConfig::default()).expect("the default config is valid")
    }

    /// A pool with explicit settings; fails when they cannot work together.
    pub fn with_config(backend: Arc<dyn Backend>, config: PoolConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let tier = || Tier {
            peaks: Mutex::default(),
            shards: (0..SHARDS)
                .map(|_| Mutex::default())
                .collect::<Box<[_]>>()
                .try_into()
                .expect("SHARDS shards"),
        };
        let recorder = config.record_trace.then(Recorder::new);
        Ok(MemoryPool {
            backend,
            config,
            tiers: [tier(), tier(), tier()],
            recorder,
        })
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Bytes the pool would reserve for a request: rounded to `block_size`, plus room to
    /// align the start when `alignment` exceeds `block_size`. `None` when that overflows.
    pub fn block_size_for(&self, bytes: u64, alignment: Alignment) -> Option<u64> {
        let block_size = self.config.block_size;
        let rounded = bytes.max(1).checked_next_multiple_of(block_size)?;
        rounded.checked_add(alignment.bytes().saturating_sub(block_size))
    }

    /// Allocates `bytes` in `scope`, starting at a multiple of `alignment`.
    ///
    /// On failure the pool releases its cached free segments and retries once
    /// (`num_alloc_retries`); if that fails too it counts `num_ooms` and returns an
    /// [`OutOfMemory`] report.
    pub(crate) fn allocate(
        &self,
        scope: Scope,
        bytes: u64,
        alignment: Alignment,
    ) -> Result<Placement, AllocError> {
        let size = self
            .block_size_for(bytes, alignment)
            .ok_or(AllocError::SizeOverflow {
                bytes,
                alignment: alignment.bytes(),
            })?;
        let shard = thread_shard();
        let (owner, block, address) = match self.allocate_fast(scope, shard, size, bytes) {
            Some(address) => (shard, address.0, address.1),
            None => self.allocate_slow(scope, shard, size, bytes)?,
        };
        Ok(Placement {
            block: block_id(owner, block),
            address: align_up(address, alignment.bytes()),
        })
    }

    /// The fast path: a cached block of the thread's shard (from a recent list, else by
    /// best fit), when the shard's allowance covers every counter the allocation can
    /// raise. Returns the block and its address.
    #[inline]
    fn allocate_fast(
        &self,
        scope: Scope,
        shard: usize,
        size: u64,
        requested: u64,
    ) -> Option<(BlockId, u64)> {
        if !self.config.caching {
            return None;
        }
        let mut guard = self.tiers[scope.index()].shards[shard % SHARDS].lock();
        let Shard {
            tier, allowance, ..
        } = &mut *guard;
        let kind = self.kind_for(size);
        if kind == PoolKind::Small {
            let class = self.recent_class(size);
            if let Some(&block) = tier.recent.get(class).and_then(|list| list.last()) {
                // An exact fit: it only lowers inactive_split.
                let stats = &tier.stats;
                let allowed = allowance.permits(stats, Counter::Allocation, kind, 1)
                    && allowance.permits(stats, Counter::AllocatedBytes, kind, size)
                    && allowance.permits(stats, Counter::RequestedBytes, kind, requested);
                if !allowed {
                    return None;
                }
                tier.recent[class].pop();
                tier.recent_count -= 1;
                tier.take_cached(block);
                tier.mark_allocated(block, requested);
                return Some(self.placed(tier, scope, block, requested));
            }
        }
        let block = self.best_fit_candidate(tier, kind, size)?;
        let cached = tier.blocks[block as usize];
        // inactive_split loses the cached block (if its segment is split), then gains the
        // remainder split off it (if any): it never passes the larger of before and after.
        let splits = self.splits(&cached, size);
        let remainder = if splits { cached.size - size } else { 0 };
        let lost = if cached.is_split() { cached.size } else { 0 };
        let inactive_change = (
            i64::from(splits) - i64::from(cached.is_split()),
            remainder as i64 - lost as i64,
        );
        let stats = &tier.stats;
        let allowed = allowance.permits(stats, Counter::Allocation, kind, 1)
            && allowance.permits(
                stats,
                Counter::AllocatedBytes,
                kind,
                cached.size - remainder,
            )
            && allowance.permits(stats, Counter::RequestedBytes, kind, requested)
            && inactive_split_allowed(allowance, stats, kind, inactive_change);
        if !allowed {
            return None;
        }
        tier.remove_free(block);
        self.split_and_mark(tier, block, size, requested);
        Some(self.placed(tier, scope, block, requested))
    }

    /// Records a new allocation; returns its block and address.
    #[inline]
    fn placed(
        &self,
        tier: &TierState,
        scope: Scope,
        block: BlockId,
        requested: u64,
    ) -> (BlockId, u64) {
        let placed = tier.blocks[block as usize];
        self.record(TraceAction::Alloc, scope, &placed, requested);
        (block, placed.address)
    }

    /// Every other allocation, with the whole tier locked. Returns the shard that serves
    /// it, the block and its address.
    fn allocate_slow(
        &self,
        scope: Scope,
        shard: usize,
        size: u64,
        requested: u64,
    ) -> Result<(usize, BlockId, u64), AllocError> {
        let mut world = self.lock_world(scope, Some(shard));
        let find_or_reserve = |world: &mut World| {
            world.in_shard(shard, |tier, reserved_elsewhere| {
                self.find_or_reserve(tier, scope, size, reserved_elsewhere)
            })
        };
        let (owner, block) = match find_or_reserve(&mut world) {
            Ok(block) => (shard, block),
            Err(BackendError::Exhausted { .. }) => {
                world.in_shard(shard, |tier, _| tier.stats.num_alloc_retries += 1);
                for index in world.shard_indices() {
                    world.in_shard(index, |tier, _| self.release_cached(tier, scope));
                }
                match find_or_reserve(&mut world) {
                    Ok(block) => (shard, block),
                    Err(BackendError::Exhausted { .. }) => {
                        match self.best_fit_anywhere(&mut world, shard, size) {
                            Some(found) => found,
                            None => {
                                return Err(
                                    self.out_of_memory(&mut world, scope, shard, requested, size)
                                )
                            }
                        }
                    }
                    Err(other) => return Err(other.into()),
                }
            }
            Err(other) => return Err(other.into()),
        };
        let address = world.in_shard(owner, |tier, _| {
            self.split_and_mark(tier, block, size, requested);
            let placed = tier.blocks[block as usize];
            self.record(TraceAction::Alloc, scope, &placed, requested);
            placed.address
        });
        Ok((owner, block, address))
    }

    /// No room for a new segment: a cached block of the other pool of this shard, or of
    /// any pool of another shard, serves the request rather than an out-of-memory error
    /// (PyTorch keeps the pools apart even then, and fails).
    fn best_fit_anywhere(
        &self,
        world: &mut World,
        shard: usize,
        size: u64,
    ) -> Option<(usize, BlockId)> {
        let kind = self.kind_for(size);
        let other = match kind {
            PoolKind::Small => PoolKind::Large,
            PoolKind::Large => PoolKind::Small,
        };
        let elsewhere = world
            .shard_indices()
            .into_iter()
            .filter(|&index| index != shard)
            .flat_map(|index| [(index, kind), (index, other)]);
        std::iter::once((shard, other))
            .chain(elsewhere)
            .find_map(|(index, kind)| {
                let block = world.in_shard(index, |tier, _| self.best_fit(tier, kind, size))?;
                Some((index, block))
            })
    }

    /// Locks the tier's peaks, then every shard in use (counting `acting` as in use), in
    /// index order. Never called while the caller holds a shard's lock.
    fn lock_world(&self, scope: Scope, acting: Option<usize>) -> World<'_> {
        let tier = &self.tiers[scope.index()];
        let mut peaks = tier.peaks.lock();
        if let Some(shard) = acting {
            peaks.in_use |= 1 << shard;
        }
        let in_use = peaks.in_use;
        let mut shards: SmallVec<[(usize, MutexGuard<Shard>); 4]> = (0..SHARDS)
            .filter(|index| in_use & (1 << index) != 0)
            .map(|index| (index, tier.shards[index].lock()))
            .collect();
        // A shard's recent lists are made when it is first used (thousands of empty lists
        // for each of the shards a single-threaded pool never touches otherwise).
        let classes = (self.config.small_size / self.config.block_size) as usize;
        for (_, shard) in &mut shards {
            if shard.tier.recent.is_empty() {
                shard.tier.recent = vec![Vec::new(); classes];
            }
        }
        World { peaks, shards }
    }

    #[inline]
    fn record(&self, action: TraceAction, scope: Scope, block: &Block, requested: u64) {
        if let Some(recorder) = &self.recorder {
            recorder.record(action, scope, block.address, block.size, requested, None);
        }
    }

    /// Returns a block to the pool (or to the backend when caching is off).
    pub(crate) fn release(&self, scope: Scope, id: BlockId) {
        let (shard, block) = shard_and_index(id);
        if self.release_fast(scope, shard, block) {
            return;
        }
        let mut world = self.lock_world(scope, None);
        world.in_shard(shard, |tier, _| self.release_in(tier, scope, block));
    }

    /// The fast path: a block back into its shard's caches, when the shard's allowance
    /// covers the inactive_split counters that this raises.
    #[inline]
    fn release_fast(&self, scope: Scope, shard: usize, block: BlockId) -> bool {
        if !self.config.caching {
            return false;
        }
        let mut guard = self.tiers[scope.index()].shards[shard % SHARDS].lock();
        let Shard {
            tier, allowance, ..
        } = &mut *guard;
        let freed = tier.blocks[block as usize];
        let class = self.recent_class_for(tier, &freed);
        let change = tier.inactive_split_change_on_free(block, class.is_some());
        if !inactive_split_allowed(allowance, &tier.stats, freed.kind, change) {
            return false;
        }
        self.cache_freed(tier, scope, block, class);
        true
    }

    /// Returns a block of one shard, the tier locked.
    fn release_in(&self, tier: &mut TierState, scope: Scope, block: BlockId) {
        if self.config.caching {
            let class = self.recent_class_for(tier, &tier.blocks[block as usize]);
            self.cache_freed(tier, scope, block, class);
            return;
        }
        let freed = tier.blocks[block as usize];
        tier.count_free(&freed);
        self.record(TraceAction::Free, scope, &freed, freed.requested);
        tier.blocks[block as usize].state = State::Free;
        self.release_segment(tier, scope, block);
    }

    /// Counts an allocated block freed and caches it: in recent list `class`, or
    /// coalesced into the best-fit tree.
    #[inline]
    fn cache_freed(
        &self,
        tier: &mut TierState,
        scope: Scope,
        block: BlockId,
        class: Option<usize>,
    ) {
        let freed = tier.blocks[block as usize];
        debug_assert_eq!(freed.state, State::Allocated);
        tier.count_free(&freed);
        self.record(TraceAction::Free, scope, &freed, freed.requested);
        match class {
            Some(class) => tier.push_recent(block, class),
            None => tier.insert_free(block),
        }
    }

    /// The recent list a freed block may wait in, if it has room. A small segment may
    /// hold a larger block lent to a large request at the limit: it goes back to the
    /// best-fit tree, which takes any size.
    #[inline]
    fn recent_class_for(&self, tier: &TierState, freed: &Block) -> Option<usize> {
        (freed.kind == PoolKind::Small && freed.size <= self.config.small_size)
            .then(|| self.recent_class(freed.size))
            .filter(|&class| tier.recent[class].len() < RECENT_DEPTH)
    }

    fn recent_class(&self, size: u64) -> usize {
        // block_size is a power of two: shift rather than divide on the hot path.
        (size >> self.config.block_size.trailing_zeros()) as usize - 1
    }

    fn kind_for(&self, size: u64) -> PoolKind {
        if size <= self.config.small_size {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// A cached block of `size` in one shard, or a new segment for it. `reserved_elsewhere`:
    /// what the tier's other shards reserve, counted against `max_size`.
    fn find_or_reserve(
        &self,
        tier: &mut TierState,
        scope: Scope,
        size: u64,
        reserved_elsewhere: u64,
    ) -> Result<BlockId, BackendError> {
        let kind = self.kind_for(size);
        if !self.config.caching {
            return self.reserve_segment(tier, scope, size, kind, reserved_elsewhere);
        }
        if kind == PoolKind::Small {
            if let Some(block) = tier.recent[self.recent_class(size)].pop() {
                tier.recent_count -= 1;
                tier.take_cached(block);
                return Ok(block);
            }
        }
        if let Some(block) = self.best_fit(tier, kind, size) {
            return Ok(block);
        }
        if tier.recent_count > 0 {
            tier.flush_recent();
            if let Some(block) = self.best_fit(tier, kind, size) {
                return Ok(block);
            }
        }
        if kind == PoolKind::Large && self.config.reclaim_on_miss {
            self.release_unsplit(tier, scope, PoolKind::Large);
        }
        // On-chip tiers are smaller than a default segment: never ask for more than exists.
        let capacity = self.backend.capacity(scope).unwrap_or(u64::MAX);
        let segment = self.segment_size(size, kind).min(capacity).max(size);
        match self.reserve_segment(tier, scope, segment, kind, reserved_elsewhere) {
            // A shared segment does not fit, but the block alone might.
            Err(BackendError::Exhausted { .. }) if segment > size => {
                self.reserve_segment(tier, scope, size, kind, reserved_elsewhere)
            }
            reserved => reserved,
        }
    }

    /// The smallest cached block that fits, unless `max_split_size` forbids using it.
    fn best_fit(&self, tier: &mut TierState, kind: PoolKind, size: u64) -> Option<BlockId> {
        let block = self.best_fit_candidate(tier, kind, size)?;
        tier.remove_free(block);
        Some(block)
    }

    /// The block [`MemoryPool::best_fit`] would take, left in the tree.
    fn best_fit_candidate(&self, tier: &TierState, kind: PoolKind, size: u64) -> Option<BlockId> {
        let &(block_size, _, block) = tier.tree_of(kind).range((size, 0, 0)..).next()?;
        if let Some(max_split) = self.config.max_split_size {
            let oversize = block_size >= max_split;
            if oversize && (size < max_split || block_size >= size + self.config.medium_segment) {
                return None;
            }
        }
        Some(block)
    }

    fn segment_size(&self, size: u64, kind: PoolKind) -> u64 {
        let config = &self.config;
        match kind {
            PoolKind::Small => config.small_segment,
            PoolKind::Large if size <= config.medium_limit => config.medium_segment.max(size),
            PoolKind::Large => align_up(size, config.large_round),
        }
    }

    fn reserve_segment(
        &self,
        tier: &mut TierState,
        scope: Scope,
        segment: u64,
        kind: PoolKind,
        reserved_elsewhere: u64,
    ) -> Result<BlockId, BackendError> {
        if let Some(max_size) = self.config.max_size {
            let reserved = tier.stats.reserved_bytes.all.current + reserved_elsewhere;
            if reserved + segment > max_size {
                return Err(BackendError::Exhausted {
                    scope,
                    bytes: segment,
                    free: max_size.saturating_sub(reserved),
                });
            }
        }
        let address = self
            .backend
            .reserve(scope, segment, self.config.block_size)?;
        tier.stats.segment.increase(kind, 1);
        tier.stats.reserved_bytes.increase(kind, segment);
        tier.stats.num_device_alloc += 1;
        if let Some(recorder) = &self.recorder {
            recorder.record(
                TraceAction::SegmentAlloc,
                scope,
                address,
                segment,
                segment,
                None,
            );
        }
        Ok(tier.new_block(Block {
            address,
            size: segment,
            requested: 0,
            prev: NONE,
            next: NONE,
            state: State::Free,
            kind,
        }))
    }

    /// Gives an unsplit free block's segment back to the backend.
    fn release_segment(&self, tier: &mut TierState, scope: Scope, block: BlockId) {
        let segment = tier.blocks[block as usize];
        debug_assert!(!segment.is_split());
        // SAFETY: an unsplit block spans exactly the segment reserved for it, with the
        // pool's block_size alignment, and no buffer refers to a free block.
        unsafe {
            self.backend
                .release(scope, segment.address, segment.size, self.config.block_size)
        };
        tier.stats.segment.decrease(segment.kind, 1);
        tier.stats
            .reserved_bytes
            .decrease(segment.kind, segment.size);
        tier.stats.num_device_free += 1;
        tier.kill_block(block);
        if let Some(recorder) = &self.recorder {
            recorder.record(
                TraceAction::SegmentFree,
                scope,
                segment.address,
                segment.size,
                segment.size,
                None,
            );
        }
    }

    /// Releases every cached segment that holds no allocation (`torch.cuda.empty_cache`).
    pub fn empty_cache(&self) {
        for scope in Scope::ALL {
            let mut world = self.lock_world(scope, None);
            for index in world.shard_indices() {
                world.in_shard(index, |tier, _| self.release_cached(tier, scope));
            }
        }
    }

    fn release_cached(&self, tier: &mut TierState, scope: Scope) {
        tier.flush_recent();
        self.release_unsplit(tier, scope, PoolKind::Small);
        self.release_unsplit(tier, scope, PoolKind::Large);
    }

    /// Releases the wholly free segments in the best-fit tree of one pool.
    fn release_unsplit(&self, tier: &mut TierState, scope: Scope, kind: PoolKind) {
        let unsplit: Vec<BlockId> = tier
            .tree_of(kind)
            .iter()
            .map(|&(_, _, block)| block)
            .filter(|&block| !tier.blocks[block as usize].is_split())
            .collect();
        for block in unsplit {
            tier.remove_free(block);
            self.release_segment(tier, scope, block);
        }
    }

    fn out_of_memory(
        &self,
        world: &mut World,
        scope: Scope,
        shard: usize,
        requested: u64,
        size: u64,
    ) -> AllocError {
        world.in_shard(shard, |tier, _| tier.stats.num_ooms += 1);
        let stats = world.stats();
        let device_free = self.backend.free_bytes(scope);
        if let Some(recorder) = &self.recorder {
            recorder.record(
                TraceAction::Oom,
                scope,
                0,
                size,
                requested,
                Some(device_free),
            );
        }
        let reserved = stats.reserved_bytes.all.current;
        let segment = self.segment_size(size, self.kind_for(size));
        let max_size = self.config.max_size.filter(|&max| reserved + segment > max);
        AllocError::OutOfMemory(Box::new(OutOfMemory {
            scope,
            requested,
            rounded: size,
            device_free,
            device_capacity: self.backend.capacity(scope),
            largest_free_block: world.largest_free(),
            reserved,
            allocated: stats.allocated_bytes.all.current,
            max_size,
        }))
    }

    /// Takes `size` bytes from the front of free block `block`, splitting off the rest when
    /// it is worth keeping, and counts the allocation.
    /// Whether taking `size` bytes from cached block `block` splits off the rest.
    fn splits(&self, block: &Block, size: u64) -> bool {
        let remaining = block.size - size;
        let worth_splitting = match block.kind {
            PoolKind::Small => remaining >= self.config.block_size,
            PoolKind::Large => {
                remaining > self.config.small_size
                    && self
                        .config
                        .max_split_size
                        .is_none_or(|max_split| size < max_split)
            }
        };
        self.config.caching && worth_splitting
    }

    fn split_and_mark(&self, tier: &mut TierState, block: BlockId, size: u64, requested: u64) {
        // Allocated before the remainder goes into the tree, so that it is not merged back.
        tier.blocks[block as usize].state = State::Allocated;
        let original = tier.blocks[block as usize];
        let remaining = original.size - size;
        if self.splits(&original, size) {
            let remainder = tier.new_block(Block {
                address: original.address + size,
                size: remaining,
                requested: 0,
                prev: block,
                next: original.next,
                state: State::Free,
                kind: original.kind,
            });
            if original.next != NONE {
                tier.blocks[original.next as usize].prev = remainder;
            }
            let allocated = &mut tier.blocks[block as usize];
            allocated.next = remainder;
            allocated.size = size;
            tier.insert_free(remainder);
        }
        tier.mark_allocated(block, requested);
    }

    /// Statistics of the global tier, the one PyTorch's `memory_stats()` describes.
    pub fn memory_stats(&self) -> MemoryStats {
        self.memory_stats_for(Scope::Global)
    }

    /// Statistics of one tier. Tiers are not summed: on-chip bytes and HBM bytes are
    /// different resources, and the peak of a sum is not the sum of peaks.
    pub fn memory_stats_for(&self, scope: Scope) -> MemoryStats {
        let mut stats = self.lock_world(scope, None).stats();
        // Frees complete at once (copies are synchronised by their scopes), so every
        // allocated block is active and no block is pending: active mirrors allocated.
        stats.active = stats.allocation;
        stats.active_bytes = stats.allocated_bytes;
        stats
    }

    /// Bytes currently reserved from the backend in one tier (cheaper than
    /// [`MemoryPool::memory_stats_for`]).
    pub fn reserved_bytes(&self, scope: Scope) -> u64 {
        let world = self.lock_world(scope, None);
        world
            .shards
            .iter()
            .map(|(_, shard)| shard.tier.stats.reserved_bytes.all.current)
            .sum()
    }

    /// Sets the peaks of every tier to their current values.
    pub fn reset_peak(&self) {
        for scope in Scope::ALL {
            self.reset_peak_for(scope);
        }
    }

    /// Sets the peaks of one tier to their current values. Each shard's allowance becomes
    /// its current values, which sum to the new peaks.
    pub fn reset_peak_for(&self, scope: Scope) {
        let mut world = self.lock_world(scope, None);
        world.peaks.peaks = world.currents();
        for (_, shard) in &mut world.shards {
            shard.allowance = shard.tier.stats.currents();
            shard.high_water = shard.allowance;
        }
    }

    /// `1 - largest_free / total_free` over the cached free blocks of a tier: 0 when all
    /// cached bytes form one block, near 1 when they are scattered in small pieces.
    pub fn fragmentation(&self, scope: Scope) -> f64 {
        let mut world = self.lock_world(scope, None);
        for index in world.shard_indices() {
            world.in_shard(index, |tier, _| tier.flush_recent());
        }
        let total: u64 = world
            .shards
            .iter()
            .flat_map(|(_, shard)| shard.tier.free_blocks().map(|(size, _)| size))
            .sum();
        if total == 0 {
            return 0.0;
        }
        1.0 - world.largest_free() as f64 / total as f64
    }

    /// Marks the events recorded until the guard drops with a stage name, e.g. a kernel
    /// or a training phase. Does nothing when `record_trace` is off.
    pub fn stage(&self, name: &str) -> StageGuard<'_> {
        StageGuard::enter(self.recorder.as_ref(), name)
    }

    /// The state of every segment and the recorded events, in PyTorch's snapshot structure.
    pub fn snapshot(&self) -> Snapshot {
        let mut segments = Vec::new();
        for scope in Scope::ALL {
            let mut world = self.lock_world(scope, None);
            for index in world.shard_indices() {
                world.in_shard(index, |tier, _| tier.flush_recent());
            }
            for (_, shard) in &world.shards {
                segments.extend(shard.tier.segments(scope));
            }
        }
        segments.sort_by_key(|segment| segment.address);
        Snapshot {
            device: self.backend.device_index(),
            segments,
            trace: self
                .recorder
                .as_ref()
                .map(Recorder::events)
                .unwrap_or_default(),
        }
    }

    /// Checks the block tables against the statistics and the backend; used by tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        for scope in Scope::ALL {
            let world = self.lock_world(scope, None);
            for (_, shard) in &world.shards {
                shard.tier.check(scope)?;
            }
            let peaks = &world.peaks.peaks;
            if !world.currents().within(peaks) {
                return Err(format!("{scope}: a current value exceeds its peak"));
            }
            let allowances = world
                .shards
                .iter()
                .fold(Counters::default(), |sum, (_, shard)| {
                    sum.plus(shard.allowance)
                });
            if !allowances.within(peaks) {
                return Err(format!(
                    "{scope}: the shards' allowances exceed the peaks, so a peak may be missed"
                ));
            }
        }
        Ok(())
    }
}

impl Drop for MemoryPool {
    fn drop(&mut self) {
        // Buffers borrow the pool, so none is alive here and every segment is free.
        self.empty_cache();
    }
}

impl TierState {
    fn new_block(&mut self, block: Block) -> BlockId {
        match self.dead_slots.pop() {
            Some(id) => {
                self.blocks[id as usize] = block;
                id
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as BlockId
            }
        }
    }

    fn kill_block(&mut self, id: BlockId) {
        self.blocks[id as usize].state = State::Dead;
        self.dead_slots.push(id);
    }

    fn tree_of(&self, kind: PoolKind) -> &FreeTree {
        match kind {
            PoolKind::Small => &self.free_small,
            PoolKind::Large => &self.free_large,
        }
    }

    fn tree(&mut self, kind: PoolKind) -> &mut FreeTree {
        match kind {
            PoolKind::Small => &mut self.free_small,
            PoolKind::Large => &mut self.free_large,
        }
    }

    /// Marks a block allocated for `requested` bytes and counts it.
    #[inline]
    fn mark_allocated(&mut self, id: BlockId, requested: u64) {
        let block = &mut self.blocks[id as usize];
        block.state = State::Allocated;
        block.requested = requested;
        let (kind, size) = (block.kind, block.size);
        self.stats.allocation.increase(kind, 1);
        self.stats.allocated_bytes.increase(kind, size);
        self.stats.requested_bytes.increase(kind, requested);
    }

    /// Counts an allocated block as freed.
    #[inline]
    fn count_free(&mut self, freed: &Block) {
        self.stats.allocation.decrease(freed.kind, 1);
        self.stats.allocated_bytes.decrease(freed.kind, freed.size);
        self.stats
            .requested_bytes
            .decrease(freed.kind, freed.requested);
    }

    /// Puts a freed block into the recent list `class`, uncoalesced.
    #[inline]
    fn push_recent(&mut self, id: BlockId, class: usize) {
        let block = &mut self.blocks[id as usize];
        block.state = State::Recent;
        block.requested = 0;
        let block = *block;
        self.recent[class].push(id);
        self.recent_count += 1;
        if block.is_split() {
            self.stats.inactive_split.increase(block.kind, 1);
            self.stats
                .inactive_split_bytes
                .increase(block.kind, block.size);
        }
    }

    /// How freeing allocated block `id` changes inactive_split `(count, bytes)`: waiting
    /// uncoalesced, it is counted if its segment is split; coalesced, the free neighbours
    /// it absorbs stop being counted first, and the merged block is counted if its segment
    /// is still split.
    #[inline]
    fn inactive_split_change_on_free(&self, id: BlockId, waits: bool) -> (i64, i64) {
        let block = self.blocks[id as usize];
        if waits {
            return match block.is_split() {
                true => (1, block.size as i64),
                false => (0, 0),
            };
        }
        let free = |neighbour: BlockId| {
            neighbour != NONE && self.blocks[neighbour as usize].state == State::Free
        };
        let (mut absorbed_count, mut absorbed_bytes) = (0, 0);
        let mut beyond = |neighbour: BlockId, link: fn(&Block) -> BlockId| {
            if !free(neighbour) {
                return neighbour;
            }
            let absorbed = &self.blocks[neighbour as usize];
            absorbed_count += 1;
            absorbed_bytes += absorbed.size as i64;
            link(absorbed)
        };
        // Both sides first: each counts what it absorbs.
        let outer = [
            beyond(block.prev, |b| b.prev),
            beyond(block.next, |b| b.next),
        ];
        let still_split = outer != [NONE, NONE];
        match still_split {
            true => (1 - absorbed_count, block.size as i64),
            false => (-absorbed_count, -absorbed_bytes),
        }
    }

    /// Bookkeeping for a free block leaving the caches to be allocated.
    #[inline]
    fn take_cached(&mut self, id: BlockId) {
        let block = self.blocks[id as usize];
        if block.is_split() {
            self.stats.inactive_split.decrease(block.kind, 1);
            self.stats
                .inactive_split_bytes
                .decrease(block.kind, block.size);
        }
    }

    fn remove_free(&mut self, id: BlockId) {
        let block = self.blocks[id as usize];
        self.tree(block.kind)
            .remove(&(block.size, block.address, id));
        self.take_cached(id);
    }

    /// Puts a block into the best-fit tree, merging it with free neighbours first.
    fn insert_free(&mut self, id: BlockId) {
        for neighbour in [self.blocks[id as usize].prev, self.blocks[id as usize].next] {
            if neighbour == NONE || self.blocks[neighbour as usize].state != State::Free {
                continue;
            }
            self.remove_free(neighbour);
            let absorbed = self.blocks[neighbour as usize];
            let block = &mut self.blocks[id as usize];
            if absorbed.address < block.address {
                block.address = absorbed.address;
                block.prev = absorbed.prev;
                if absorbed.prev != NONE {
                    self.blocks[absorbed.prev as usize].next = id;
                }
            } else {
                block.next = absorbed.next;
                if absorbed.next != NONE {
                    self.blocks[absorbed.next as usize].prev = id;
                }
            }
            self.blocks[id as usize].size += absorbed.size;
            self.kill_block(neighbour);
        }
        let block = &mut self.blocks[id as usize];
        block.state = State::Free;
        block.requested = 0;
        let block = *block;
        if block.is_split() {
            self.stats.inactive_split.increase(block.kind, 1);
            self.stats
                .inactive_split_bytes
                .increase(block.kind, block.size);
        }
        self.tree(block.kind)
            .insert((block.size, block.address, id));
    }

    /// Coalesces every block waiting in the exact-size lists.
    fn flush_recent(&mut self) {
        if self.recent_count == 0 {
            return;
        }
        let waiting: Vec<BlockId> = self.recent.iter_mut().flat_map(std::mem::take).collect();
        self.recent_count = 0;
        for id in waiting {
            self.take_cached(id);
            self.insert_free(id);
        }
    }

    /// `(size, address)` of every cached free block.
    fn free_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free_small
            .iter()
            .chain(self.free_large.iter())
            .map(|&(size, address, _)| (size, address))
            .chain(self.recent.iter().flatten().map(|&id| {
                let block = &self.blocks[id as usize];
                (block.size, block.address)
            }))
    }

    fn largest_free(&self) -> u64 {
        self.free_blocks().map(|(size, _)| size).max().unwrap_or(0)
    }

    fn segments(&self, scope: Scope) -> Vec<SegmentSnapshot> {
        let heads = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, block)| block.state != State::Dead && block.prev == NONE);
        heads
            .map(|(head, first)| {
                let mut blocks = Vec::new();
                let mut id = head as BlockId;
                while id != NONE {
                    let block = &self.blocks[id as usize];
                    blocks.push(BlockSnapshot {
                        address: block.address,
                        size: block.size,
                        requested_size: block.requested,
                        state: if block.state == State::Allocated {
                            BlockState::ActiveAllocated
                        } else {
                            BlockState::Inactive
                        },
                    });
                    id = block.next;
                }
                SegmentSnapshot {
                    scope,
                    address: first.address,
                    total_size: blocks.iter().map(|b| b.size).sum(),
                    kind: first.kind,
                    blocks,
                }
            })
            .collect()
    }

    fn check(&self, scope: Scope) -> Result<(), String> {
        let segments = self.segments(scope);
        let mut allocated = 0;
        let mut requested = 0;
        let mut inactive_split = 0;
        for segment in &segments {
            let mut expected = segment.address;
            for block in &segment.blocks {
                if block.address != expected {
                    return Err(format!(
                        "{scope}: block at {:#x} expected at {expected:#x}",
                        block.address
                    ));
                }
                expected += block.size;
                match block.state {
                    BlockState::ActiveAllocated => {
                        allocated += block.size;
                        requested += block.requested_size;
                    }
                    _ if segment.blocks.len() > 1 => inactive_split += block.size,
                    _ => {}
                }
            }
        }
        let reserved: u64 = segments.iter().map(|s| s.total_size).sum();
        let stats = &self.stats;
        let pairs = [
            ("reserved_bytes", stats.reserved_bytes.all.current, reserved),
            (
                "allocated_bytes",
                stats.allocated_bytes.all.current,
                allocated,
            ),
            (
                "requested_bytes",
                stats.requested_bytes.all.current,
                requested,
            ),
            (
                "inactive_split_bytes",
                stats.inactive_split_bytes.all.current,
                inactive_split,
            ),
            ("segment", stats.segment.all.current, segments.len() as u64),
        ];
        for (name, counted, walked) in pairs {
            if counted != walked {
                return Err(format!(
                    "{scope}: {name} counted {counted} but the blocks hold {walked}"
                ));
            }
        }
        for array in [
            &stats.allocated_bytes,
            &stats.reserved_bytes,
            &stats.requested_bytes,
        ] {
            for stat in [array.all, array.small_pool, array.large_pool] {
                if stat.allocated - stat.freed != stat.current || stat.peak < stat.current {
                    return Err(format!("{scope}: inconsistent counter {stat:?}"));
                }
            }
            if array.all.current != array.small_pool.current + array.large_pool.current {
                return Err(format!("{scope}: all != small + large in {array:?}"));
            }
        }
        Ok(())
    }
}
