//! Allocate/free pairs per second on cached sizes: the caching pool against the system
//! allocator and against the pool with caching off (every pair goes to the backend), on one
//! thread and on two threads sharing one pool.
//!
//! Each case is measured twice: `wall` is elapsed time; `cpu` is the CPU time of the
//! busiest benchmark thread (`CLOCK_THREAD_CPUTIME_ID`), which is what the wall
//! time would be on an otherwise idle machine; our shared development VM rarely is.
//!
//! `cargo bench -p headroom-mem --bench alloc_free`

use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use headroom_mem::{Alignment, DType, HostMemory, MemoryPool, PoolConfig, Scope};

const SIZES: [(&str, u64); 2] = [("4KiB", 4 << 10), ("4MiB", 4 << 20)];

fn pool(config: PoolConfig) -> MemoryPool {
    MemoryPool::with_config(Arc::new(HostMemory::new()), config).expect("valid config")
}

fn pool_pair(pool: &MemoryPool, bytes: u64) {
    let allocation = pool
        .allocate_bytes(bytes, Scope::Global, Alignment::DEFAULT)
        .expect("fits");
    black_box(allocation.address());
}

fn system_pair(layout: Layout) {
    // SAFETY: the layout has a non-zero size; the pointer is freed with the same layout.
    unsafe {
        let pointer = alloc(layout);
        black_box(pointer);
        dealloc(pointer, layout);
    }
}

/// CPU time this thread has run, or `None` where the clock is unavailable.
fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    (status == 0).then(|| Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}

#[derive(Clone, Copy)]
enum Clock {
    Wall,
    Cpu,
}

/// Runs `pair` `iterations` times on each of `threads` threads at once; returns the wall
/// time, or the largest per-thread CPU time.
fn on_threads(clock: Clock, threads: usize, iterations: u64, pair: &(dyn Fn() + Sync)) -> Duration {
    let start = Instant::now();
    let cpu_times: Vec<Duration> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let before = thread_cpu_time();
                    (0..iterations).for_each(|_| pair());
                    let after = thread_cpu_time();
                    before.zip(after).map(|(before, after)| after - before)
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|worker| worker.join().ok().flatten())
            .collect()
    });
    let wall = start.elapsed();
    match clock {
        Clock::Cpu if cpu_times.len() == threads => cpu_times.into_iter().max().unwrap_or(wall),
        _ => wall,
    }
}

fn throughput(c: &mut Criterion) {
    let caching = pool(PoolConfig::default());
    let no_cache = pool(PoolConfig::no_cache());
    for (clock, clock_name, threads) in [
        (Clock::Wall, "wall", 1usize),
        (Clock::Cpu, "cpu", 1),
        (Clock::Wall, "wall", 2),
        (Clock::Cpu, "cpu", 2),
    ] {
        let mut group =
            c.benchmark_group(format!("alloc_free_pairs/{threads}_thread/{clock_name}"));
        group.throughput(Throughput::Elements(threads as u64));
        group
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for (label, bytes) in SIZES {
            let layout = Layout::from_size_align(bytes as usize, 512).expect("valid layout");
            let cases: [(&str, &(dyn Fn() + Sync)); 3] = [
                ("caching_pool", &|| pool_pair(&caching, bytes)),
                ("no_cache_pool", &|| pool_pair(&no_cache, bytes)),
                ("system_allocator", &|| system_pair(layout)),
            ];
            for (name, pair) in cases {
                group.bench_function(BenchmarkId::new(name, label), |b| {
                    b.iter_custom(|iterations| on_threads(clock, threads, iterations, pair))
                });
            }
        }
        group.finish();
    }
    let mut group = c.benchmark_group("alloc_buffer_pairs/1_thread/cpu");
    group.throughput(Throughput::Elements(1));
    let typed_pair = || {
        let buffer = caching.alloc_buffer([32, 32], DType::F32, Scope::Global, Alignment::DEFAULT);
        black_box(buffer.expect("fits").address());
    };
    group.bench_function("caching_pool_f32_32x32", |b| {
        b.iter_custom(|iterations| on_threads(Clock::Cpu, 1, iterations, &typed_pair))
    });
    group.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
