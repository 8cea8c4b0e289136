//! Quick allocate/free loop for profiling (`perf record`), without criterion's machinery.
//!
//! `cargo run --release -p headroom-mem --example pairs -- 4096 10000000`

use std::sync::Arc;
use std::time::Instant;

use headroom_mem::{Alignment, HostMemory, MemoryPool, Scope};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<u64>().unwrap_or(0));
    let bytes = args.next().unwrap_or(4096);
    let pairs = args.next().unwrap_or(10_000_000);
    let pool = MemoryPool::new(Arc::new(HostMemory::new()));
    let start = Instant::now();
    for _ in 0..pairs {
        let allocation = pool.allocate_bytes(bytes, Scope::Global, Alignment::DEFAULT);
        std::hint::black_box(allocation.map(|a| a.address()).ok());
    }
    let elapsed = start.elapsed();
    println!(
        "{bytes} B: {:.1} ns/pair, {:.2} M pairs/s",
        elapsed.as_nanos() as f64 / pairs as f64,
        pairs as f64 / elapsed.as_secs_f64() / 1e6
    );
}
