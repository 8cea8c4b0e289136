//! Allocate/free pairs per second on 1, 2, 4 and 8 threads sharing one pool, side by side
//! with the system allocator (`std::alloc::alloc`/`dealloc` of the same size), so a change
//! to the pool's locking shows up as a ratio measured in one run on one machine.
//!
//! Every repetition runs each (allocator, threads) case once, interleaved, so the noise of a
//! shared machine falls on both allocators alike; medians over the repetitions are printed.
//! The same number of pairs is split across the threads of a run.
//!
//! `cargo run --release -p headroom-mem --example pairs -- [--bytes 4096] [--pairs 4000000]
//! [--reps 5] [--threads 1,2,4,8] [--backend host|cuda] [--json]`
//!
//! `--backend cuda` (built with `--features cuda`) puts the pool on GPU 0; PyTorch's caching
//! allocator is its baseline there (bench/mem/torch_pairs.py), and the system column stays
//! the host's, for reference.

use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use headroom_mem::{Alignment, Backend, HostMemory, MemoryPool, Scope};

struct Options {
    bytes: u64,
    pairs: u64,
    reps: usize,
    threads: Vec<usize>,
    backend: String,
    json: bool,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        bytes: 4096,
        pairs: 4_000_000,
        reps: 5,
        threads: vec![1, 2, 4, 8],
        backend: "host".into(),
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--json" {
            options.json = true;
            continue;
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value, e.g. {flag} 4"))?;
        let number = |value: &str| {
            value
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{flag} {value}: expected a positive integer"))
        };
        match flag.as_str() {
            "--bytes" => options.bytes = number(&value)?,
            "--pairs" => options.pairs = number(&value)?,
            "--reps" => options.reps = number(&value)? as usize,
            "--backend" => options.backend = value,
            "--threads" => {
                options.threads = value
                    .split(',')
                    .map(|n| number(n).map(|n| n as usize))
                    .collect::<Result<_, _>>()?
            }
            _ => {
                return Err(format!(
                "unknown flag {flag}; use --bytes, --pairs, --reps, --threads, --backend or --json"
            ))
            }
        }
    }
    Ok(options)
}

/// Runs `pair` `pairs / threads` times on each of `threads` threads started together;
/// returns the total pairs per second in millions.
fn pairs_per_second(threads: usize, pairs: u64, pair: &(dyn Fn() + Sync)) -> f64 {
    let per_thread = pairs / threads as u64;
    let start_line = Barrier::new(threads + 1);
    let elapsed = std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                start_line.wait();
                (0..per_thread).for_each(|_| pair());
            });
        }
        start_line.wait();
        let start = Instant::now();
        // Leaving the scope joins every worker.
        start
    })
    .elapsed();
    (per_thread * threads as u64) as f64 / elapsed.as_secs_f64() / 1e6
}

/// The memory the pool's pairs come from.
fn backend(name: &str) -> Result<Arc<dyn Backend>, String> {
    match name {
        "host" => Ok(Arc::new(HostMemory::new())),
        #[cfg(feature = "cuda")]
        "cuda" => headroom_mem::CudaDevice::new(0)
            .map(|device| Arc::new(device) as Arc<dyn Backend>)
            .map_err(|error| format!("--backend cuda: {error}")),
        other => Err(format!(
            "--backend {other}: expected host, or cuda in a build with --features cuda"
        )),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let options = parse_options().unwrap_or_else(|message| {
        eprintln!("pairs: {message}");
        std::process::exit(2);
    });
    let bytes = options.bytes;
    let pool = MemoryPool::new(backend(&options.backend).unwrap_or_else(|message| {
        eprintln!("pairs: {message}");
        std::process::exit(2);
    }));
    let layout = Layout::from_size_align(bytes as usize, 512).expect("a valid layout");
    let pool_pair = || {
        let allocation = pool.allocate_bytes(bytes, Scope::Global, Alignment::DEFAULT);
        black_box(allocation.expect("memory for one block").address());
    };
    let system_pair = || {
        // SAFETY: the layout has a non-zero size; the pointer is freed with the same layout.
        unsafe {
            let pointer = alloc(layout);
            black_box(pointer);
            dealloc(pointer, layout);
        }
    };
    let cases: [(&str, &(dyn Fn() + Sync)); 2] = [("pool", &pool_pair), ("system", &system_pair)];
    // samples[case][threads index][rep]
    let mut samples = vec![vec![Vec::new(); options.threads.len()]; cases.len()];
    for _ in 0..options.reps {
        for (t, &threads) in options.threads.iter().enumerate() {
            for (c, (_, pair)) in cases.iter().enumerate() {
                samples[c][t].push(pairs_per_second(threads, options.pairs, *pair));
            }
        }
    }
    let medians: Vec<Vec<f64>> = samples
        .iter_mut()
        .map(|per_threads| per_threads.iter_mut().map(|s| median(s)).collect())
        .collect();
    let (pool_m, system_m) = (&medians[0], &medians[1]);
    if options.json {
        let rows: Vec<String> = options
            .threads
            .iter()
            .enumerate()
            .map(|(t, threads)| {
                format!(
                    "{{\"threads\":{threads},\"pool_mpairs\":{:.3},\"system_mpairs\":{:.3}}}",
                    pool_m[t], system_m[t]
                )
            })
            .collect();
        println!(
            "{{\"bytes\":{bytes},\"pairs\":{},\"reps\":{},\"rows\":[{}]}}",
            options.pairs,
            options.reps,
            rows.join(",")
        );
        return;
    }
    println!(
        "{bytes} B alloc/free pairs, total over threads, median of {} runs of {} pairs (M pairs/s); pool on {}",
        options.reps, options.pairs, options.backend
    );
    println!("threads     pool   system  pool/system  pool/pool@1  system/system@1");
    for (t, threads) in options.threads.iter().enumerate() {
        println!(
            "{threads:>7} {:>8.2} {:>8.2} {:>12.2} {:>12.2} {:>16.2}",
            pool_m[t],
            system_m[t],
            pool_m[t] / system_m[t],
            pool_m[t] / pool_m[0],
            system_m[t] / system_m[0],
        );
    }
}
