//! One pool shared by real threads: statistics stay exact (totals, currents and peaks),
//! buffers freed on another thread go back where they came from, and every cached block of
//! every thread's shard is visible to `empty_cache`, snapshots and out-of-memory retry.

use std::sync::mpsc;
use std::sync::{Arc, Barrier};

use headroom_mem::*;

const MIB: u64 = 1 << 20;
const THREADS: usize = 4;

/// What one churning thread did, to compare with the pool's counters.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    allocations: u64,
    requested_bytes: u64,
    /// Small blocks are exactly the rounded size; a large block may keep a remainder too
    /// small to split (up to `small_size`), so only its count is known exactly.
    small_allocations: u64,
    small_bytes: u64,
    /// The most bytes (rounded) and blocks this thread held at one time: the pool held
    /// at least that much then.
    max_held_bytes: u64,
    max_held_blocks: u64,
    /// The most bytes this thread's blocks can have spanned at one time.
    max_held_block_bytes: u64,
    /// Block bytes (at most) and blocks handed to another thread to free; live until
    /// that thread frees them.
    sent_block_bytes: u64,
    sent_blocks: u64,
}

/// `(rounded, most)`: the bytes of the block a request gets at least and at most.
fn block_bytes(pool: &MemoryPool, bytes: u64) -> (u64, u64) {
    let rounded = pool
        .block_size_for(bytes, Alignment::DEFAULT)
        .expect("no overflow");
    let small_size = pool.config().small_size;
    let remainder = if rounded > small_size { small_size } else { 0 };
    (rounded, rounded + remainder)
}

/// A size from a small deterministic generator: mostly small blocks of a few exact
/// sizes (the fast path), some odd small sizes, and a few large blocks (the slow path).
fn size_for(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let pick = *seed >> 33;
    match pick % 16 {
        0 => 2 * MIB + pick % MIB,
        1..=3 => 1 + pick % (64 << 10),
        _ => [512, 4096, 16 << 10][(pick % 3) as usize],
    }
}

/// Allocates and frees `rounds` blocks of mixed sizes on `THREADS` threads at once, each
/// holding a window of up to 8 blocks; every third block leaving a window is freed by the
/// next thread.
fn churn(pool: &MemoryPool, rounds: usize) -> Vec<Tally> {
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<Allocation>()).unzip();
    let start = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        let workers: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(thread, inbox)| {
                let next = senders[(thread + 1) % THREADS].clone();
                let start = &start;
                scope.spawn(move || {
                    let mut tally = Tally::default();
                    let mut seed = thread as u64 + 1;
                    let mut window: Vec<Allocation> = Vec::new();
                    let (mut held_bytes, mut held_block_bytes) = (0, 0);
                    start.wait();
                    for round in 0..rounds {
                        while let Ok(theirs) = inbox.try_recv() {
                            drop(theirs);
                        }
                        let bytes = size_for(&mut seed);
                        let (rounded, most) = block_bytes(pool, bytes);
                        let allocation = pool
                            .allocate_bytes(bytes, Scope::Global, Alignment::DEFAULT)
                            .expect("host memory");
                        tally.allocations += 1;
                        tally.requested_bytes += bytes;
                        if rounded == most {
                            tally.small_allocations += 1;
                            tally.small_bytes += rounded;
                        }
                        held_bytes += rounded;
                        held_block_bytes += most;
                        window.push(allocation);
                        tally.max_held_bytes = tally.max_held_bytes.max(held_bytes);
                        tally.max_held_block_bytes =
                            tally.max_held_block_bytes.max(held_block_bytes);
                        tally.max_held_blocks = tally.max_held_blocks.max(window.len() as u64);
                        if window.len() == 8 {
                            let leaving = window.swap_remove(round % 8);
                            let (rounded, most) = block_bytes(pool, leaving.len());
                            held_bytes -= rounded;
                            held_block_bytes -= most;
                            if round % 3 == 0 {
                                tally.sent_block_bytes += most;
                                tally.sent_blocks += 1;
                                next.send(leaving).expect("the next thread listens");
                            }
                        }
                    }
                    drop(window);
                    // Every thread has sent all it will send once all have passed here.
                    start.wait();
                    while let Ok(theirs) = inbox.try_recv() {
                        drop(theirs);
                    }
                    tally
                })
            })
            .collect();
        drop(senders);
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a churning thread panicked"))
            .collect()
    })
}

fn host_pool() -> MemoryPool {
    MemoryPool::new(Arc::new(HostMemory::new()))
}

#[test]
fn counters_after_concurrent_churn_are_exact() {
    let pool = host_pool();
    let tallies = churn(&pool, 20_000);
    pool.check_invariants().unwrap();
    let stats = pool.memory_stats();
    let sum = |field: fn(&Tally) -> u64| tallies.iter().map(field).sum::<u64>();
    for (name, stat, expected) in [
        (
            "allocation.all",
            stats.allocation.all,
            sum(|t| t.allocations),
        ),
        (
            "allocation.small_pool",
            stats.allocation.small_pool,
            sum(|t| t.small_allocations),
        ),
        (
            "allocated_bytes.small_pool",
            stats.allocated_bytes.small_pool,
            sum(|t| t.small_bytes),
        ),
        (
            "requested_bytes.all",
            stats.requested_bytes.all,
            sum(|t| t.requested_bytes),
        ),
    ] {
        assert_eq!(stat.allocated, expected, "{name}.allocated");
        assert_eq!(stat.freed, expected, "{name}.freed");
        assert_eq!(stat.current, 0, "{name}.current");
    }
    for array in [
        stats.allocation,
        stats.allocated_bytes,
        stats.requested_bytes,
    ] {
        for stat in [array.all, array.small_pool, array.large_pool] {
            assert_eq!((stat.allocated, stat.current), (stat.freed, 0), "{stat:?}");
        }
        assert_eq!(
            array.all.allocated,
            array.small_pool.allocated + array.large_pool.allocated
        );
    }
    // The pool held at least what the busiest thread held at once, and at most what all
    // threads held at their busiest plus everything ever in flight between them.
    let held_bytes = |t: &Tally| t.max_held_bytes;
    let bytes_peak = stats.allocated_bytes.all.peak;
    let most_bytes = tallies.iter().map(held_bytes).max().unwrap();
    let possible_bytes = sum(|t| t.max_held_block_bytes) + sum(|t| t.sent_block_bytes);
    assert!(
        (most_bytes..=possible_bytes).contains(&bytes_peak),
        "allocated_bytes.all.peak {bytes_peak} outside {most_bytes}..={possible_bytes}"
    );
    let blocks_peak = stats.allocation.all.peak;
    let most_blocks = tallies.iter().map(|t| t.max_held_blocks).max().unwrap();
    let possible_blocks = sum(|t| t.max_held_blocks) + sum(|t| t.sent_blocks);
    assert!(
        (most_blocks..=possible_blocks).contains(&blocks_peak),
        "allocation.all.peak {blocks_peak} outside {most_blocks}..={possible_blocks}"
    );
}

#[test]
fn empty_cache_after_concurrent_churn_releases_everything() {
    let pool = host_pool();
    churn(&pool, 5_000);
    assert!(pool.reserved_bytes(Scope::Global) > 0);
    pool.empty_cache();
    assert_eq!(pool.reserved_bytes(Scope::Global), 0);
    let stats = pool.memory_stats();
    assert_eq!(stats.reserved_bytes.all.current, 0);
    assert_eq!(stats.segment.all.current, 0);
    assert_eq!(stats.num_device_alloc, stats.num_device_free);
    pool.check_invariants().unwrap();
}

/// Runs `work` on a new thread (so on a shard of its own) and waits for it.
fn on_new_thread<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|scope| scope.spawn(work).join().expect("the thread panicked"))
}

#[test]
fn peaks_count_only_what_was_held_at_the_same_time() {
    // A small block comes back through a recent list, a large one through coalescing.
    peaks_of_blocks_held_together(64 << 10, PoolKind::Small);
    peaks_of_blocks_held_together(4 * MIB, PoolKind::Large);
}

fn peaks_of_blocks_held_together(bytes: u64, kind: PoolKind) {
    let pool = host_pool();
    let pairs = || {
        for _ in 0..100 {
            drop(pool.allocate_bytes(bytes, Scope::Global, Alignment::DEFAULT));
        }
    };
    // The main thread and three workers step through the phases together.
    let step = Barrier::new(4);
    std::thread::scope(|scope| {
        for me in 0..3 {
            let (step, pairs, pool) = (&step, &pairs, &pool);
            scope.spawn(move || {
                // One thread after the other: never more than one block at once.
                for turn in 0..3 {
                    step.wait();
                    if turn == me {
                        pairs();
                    }
                }
                step.wait();
                step.wait();
                // The same threads again, now each holding a block at the same moment.
                // They reuse their cached blocks, so this runs on the fast path.
                let held = pool.allocate_bytes(bytes, Scope::Global, Alignment::DEFAULT);
                step.wait();
                drop(held.unwrap());
                pairs();
            });
        }
        for _ in 0..4 {
            step.wait();
        }
        assert_eq!(pool.memory_stats().allocated_bytes.all.peak, bytes);
        assert_eq!(pool.memory_stats().allocation.all.peak, 1);
        step.wait();
        step.wait();
    });
    let stats = pool.memory_stats();
    assert_eq!(stats.allocated_bytes.all.peak, 3 * bytes);
    assert_eq!(stats.allocation.all.peak, 3);
    let (used, unused) = match kind {
        PoolKind::Small => (stats.allocation.small_pool, stats.allocation.large_pool),
        PoolKind::Large => (stats.allocation.large_pool, stats.allocation.small_pool),
    };
    assert_eq!((used.peak, unused.peak), (3, 0));
    pool.check_invariants().unwrap();
    // After a reset the peak is what is held now, and it grows again only as far as the
    // live total does.
    pool.reset_peak();
    let held = pool
        .allocate_bytes(4096, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    on_new_thread(|| {
        for _ in 0..100 {
            drop(pool.allocate_bytes(4096, Scope::Global, Alignment::DEFAULT));
        }
    });
    assert_eq!(pool.memory_stats().allocated_bytes.all.peak, 2 * 4096);
    drop(held);
    pool.check_invariants().unwrap();
}

#[test]
fn out_of_memory_retry_releases_segments_cached_by_other_threads() {
    // Room for one small segment (2 MiB) and nothing else.
    let pool = MemoryPool::new(Arc::new(HostMemory::with_limit(3 * MIB)));
    on_new_thread(|| {
        let block = pool.allocate_bytes(4096, Scope::Global, Alignment::DEFAULT);
        drop(block.unwrap());
    });
    assert_eq!(pool.reserved_bytes(Scope::Global), 2 * MIB);
    // Another thread needs a segment of its own: only the first thread's cached one,
    // released on retry, makes room.
    on_new_thread(|| {
        let block = pool.allocate_bytes(3 * MIB - 4096, Scope::Global, Alignment::DEFAULT);
        assert!(block.is_ok(), "{:?}", block.err());
    });
    let stats = pool.memory_stats();
    assert_eq!(stats.num_alloc_retries, 1);
    assert_eq!(stats.num_ooms, 0);
    pool.check_invariants().unwrap();
}

#[test]
fn a_block_cached_by_another_thread_serves_a_request_at_the_limit() {
    // One 2 MiB segment fits, and 32 KiB more.
    let pool = MemoryPool::new(Arc::new(HostMemory::with_limit(2 * MIB + (32 << 10))));
    let held = pool
        .allocate_bytes(4096, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    // The rest of that segment is cached in this thread's shard; another thread's small
    // request must use it rather than fail.
    on_new_thread(|| {
        let block = pool.allocate_bytes(64 << 10, Scope::Global, Alignment::DEFAULT);
        assert!(block.is_ok(), "{:?}", block.err());
    });
    assert_eq!(pool.memory_stats().num_ooms, 0);
    assert_eq!(pool.reserved_bytes(Scope::Global), 2 * MIB);
    drop(held);
    pool.check_invariants().unwrap();
}

#[test]
fn snapshots_and_fragmentation_see_blocks_cached_by_every_thread() {
    let pool = host_pool();
    let held = pool
        .allocate_bytes(4096, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    on_new_thread(|| {
        let kept = pool
            .allocate_bytes(4096, Scope::Global, Alignment::DEFAULT)
            .unwrap();
        drop(pool.allocate_bytes(8192, Scope::Global, Alignment::DEFAULT));
        // Freed here, on a thread other than the one that allocated it.
        kept
    })
    .free();
    let snapshot = pool.snapshot();
    assert_eq!(snapshot.segments.len(), 2, "one small segment per thread");
    let allocated: Vec<u64> = snapshot
        .segments
        .iter()
        .flat_map(|segment| &segment.blocks)
        .filter(|block| block.requested_size > 0)
        .map(|block| block.requested_size)
        .collect();
    assert_eq!(allocated, [4096], "only the held block is allocated");
    // Two segments each wholly free but the held block: two free blocks.
    assert!(pool.fragmentation(Scope::Global) > 0.0);
    drop(held);
    pool.check_invariants().unwrap();
}

#[test]
fn threads_that_come_and_go_reuse_one_shard_and_its_cache() {
    let pool = host_pool();
    for _ in 0..40 {
        on_new_thread(|| drop(pool.allocate_bytes(4096, Scope::Global, Alignment::DEFAULT)));
    }
    // Each thread takes the shard with the fewest live threads, so one after another they
    // share a shard and reuse its cached block. Numbering threads as they start spread them
    // over all 16 shards, each reserving a segment of its own. (Other tests' threads in this
    // process may hold a shard meanwhile, hence a bound rather than exactly one.)
    let segments = pool.memory_stats().segment.all.current;
    assert!(
        segments <= 4,
        "{segments} segments for 40 threads that never overlapped"
    );
    pool.check_invariants().unwrap();
}
