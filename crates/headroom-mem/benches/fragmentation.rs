//! Fragmentation on the bundled traces: peak reserved / peak requested for the caching pool
//! (headroom defaults and PyTorch's settings) and for power-of-two bins, replayed side by
//! side in one run, plus how many segments each pool had to reserve from the device.
//!
//! `cargo bench -p headroom-mem --bench fragmentation`

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use headroom_mem::replay::{replay, PowerOfTwoBins};
use headroom_mem::trace::read_rmm_csv;
use headroom_mem::{MemoryPool, PoolConfig, Scope, SimulatedDevice, TierCapacities};

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let traces = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces");
    println!("| trace | allocator | peak requested | peak reserved | reserved / peak requested | device allocations |");
    println!("|---|---|---|---|---|---|");
    for name in ["transformer_step.csv", "kernel_pipeline.csv"] {
        let events = read_rmm_csv(File::open(traces.join(name))?)?;
        for (label, config) in [
            ("headroom-mem pool (defaults)", PoolConfig::default()),
            (
                "headroom-mem pool (PoolConfig::pytorch)",
                PoolConfig::pytorch(),
            ),
        ] {
            let device = Arc::new(SimulatedDevice::unbacked(TierCapacities::DATACENTER_GPU));
            let pool = MemoryPool::with_config(device, config)?;
            let report = replay(&events, &pool)?;
            let device_allocations = pool.memory_stats_for(Scope::Global).num_device_alloc;
            println!(
                "| {name} | {label} | {} | {} | {:.3} | {device_allocations} |",
                mib(report.peak_requested),
                mib(report.peak_reserved),
                report.overhead_ratio(),
            );
        }
        let mut bins = PowerOfTwoBins::new();
        let report = replay(&events, &mut bins)?;
        println!(
            "| {name} | power-of-two bins | {} | {} | {:.3} | {} |",
            mib(report.peak_requested),
            mib(report.peak_reserved),
            report.overhead_ratio(),
            bins.device_allocations(),
        );
    }
    Ok(())
}
