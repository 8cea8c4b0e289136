//! The README's usage example, compiled and run so it cannot rot.
//!
//! `cargo run -p headroom-mem --example quickstart`

use std::sync::Arc;

use headroom_mem::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Arc::new(SimulatedDevice::new(TierCapacities::DATACENTER_GPU));
    let pool = MemoryPool::with_config(
        device,
        PoolConfig {
            record_trace: true,
            ..PoolConfig::default()
        },
    )?;

    // A typed buffer: freed on drop, or explicitly with `free()` (which consumes it).
    let mut x = pool.alloc_buffer(
        [8, 1024],
        DType::F32,
        Scope::Global,
        Alignment::new(4096).unwrap(),
    )?;
    copy_from_host(&mut x, &vec![1.0f32; 8 * 1024])?;
    let flat = buffer_alias(&x, [8 * 1024])?; // bounds-checked, borrows `x`
    assert!(is_aligned(&flat, Alignment::new(4096).unwrap()));

    // Out of memory: the pool already released its cache and retried; fall back to smaller shapes.
    let batch = pool.alloc_buffer_with_fallback(
        [[64, 1 << 20], [32, 1 << 20], [16, 1 << 20]],
        DType::BF16,
        Scope::Global,
        Alignment::DEFAULT,
    )?;

    // One scratch allocation reused by every stage; views cannot outlive their stage.
    let mut workspace = Workspace::new(&pool, Scope::Global, 64 << 20)?;
    {
        let stage = workspace.stage("attention"); // also annotates the trace
        let _scores = stage.alloc([8, 512, 512], DType::F16, Alignment::DEFAULT)?;
    }

    // Asynchronous copies: the scope waits for them before the borrows end.
    let stream = Stream::new();
    let mut y = pool.alloc_buffer([8, 1024], DType::F32, Scope::Global, Alignment::DEFAULT)?;
    stream.scope(|s| s.copy(&mut y, &x).map(|event| event.wait()))??;

    println!(
        "{}",
        pool.memory_stats().to_map()["allocated_bytes.all.peak"]
    );
    pool.snapshot().write_pickle(std::fs::File::create(
        std::env::temp_dir().join("headroom-mem-quickstart.pickle"),
    )?)?; // open in pytorch.org/memory_viz
    drop((flat, batch));
    x.free();
    // x.free(); // does not compile: use of moved value
    Ok(())
}
