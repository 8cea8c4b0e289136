//! The exported PyTorch snapshot pickle loads in Python with the structure memory_viz reads,
//! and recorded traces round-trip through CSV into the replayer.

use std::process::Command;
use std::sync::Arc;

use headroom_mem::replay::{replay, PowerOfTwoBins};
use headroom_mem::trace::{read_rmm_csv, write_rmm_csv};
use headroom_mem::*;

const VALIDATE: &str = r#"
import pickle, sys
with open(sys.argv[1], "rb") as f:
    snapshot = pickle.load(f)
assert set(snapshot) >= {"segments", "device_traces"}, snapshot.keys()
segments = snapshot["segments"]
assert isinstance(segments, list) and segments, "no segments"
for segment in segments:
    for key in ("device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "blocks", "frames"):
        assert key in segment, key
    assert segment["segment_type"] in ("small", "large")
    address = segment["address"]
    for block in segment["blocks"]:
        assert block["state"] in ("active_allocated", "inactive", "active_pending_free"), block
        assert block["address"] == address, (block, address)
        assert block["requested_size"] <= block["size"]
        address += block["size"]
    assert address == segment["address"] + segment["total_size"]
    allocated = sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
    assert allocated == segment["allocated_size"]
traces = snapshot["device_traces"]
assert isinstance(traces, list) and len(traces) == 1
actions = [event["action"] for event in traces[0]]
allowed = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot"}
assert set(actions) <= allowed, set(actions) - allowed
for event in traces[0]:
    assert {"addr", "size", "stream", "frames", "time_us"} <= set(event), event
    for frame in event["frames"]:
        assert {"filename", "line", "name"} <= set(frame), frame
assert actions.count("alloc") == actions.count("free_completed") + sum(
    b["state"] == "active_allocated" for s in segments for b in s["blocks"])
stages = {f["name"] for e in traces[0] for f in e["frames"]}
assert {"forward", "backward"} <= stages, stages
assert "oom" in actions and any("device_free" in e for e in traces[0] if e["action"] == "oom")
print("ok", len(segments), "segments", len(actions), "events")
"#;

fn recorded_pool() -> MemoryPool {
    let device = Arc::new(SimulatedDevice::unbacked(TierCapacities {
        global: 256 << 20,
        shared: 64 << 10,
        local: 0,
    }));
    MemoryPool::with_config(
        device,
        PoolConfig {
            record_trace: true,
            ..PoolConfig::default()
        },
    )
    .expect("valid config")
}

fn exercise(pool: &MemoryPool) -> Vec<Buffer<'_>> {
    let alloc = |elements: usize| {
        pool.alloc_buffer([elements], DType::BF16, Scope::Global, Alignment::DEFAULT)
            .unwrap()
    };
    let weights = alloc(1 << 20);
    let forward = pool.stage("forward");
    let activations: Vec<_> = (1..6).map(|i| alloc(i << 18)).collect();
    let scratch = alloc(1000);
    drop(scratch);
    drop(forward);
    let backward = pool.stage("backward");
    let gradient = alloc(1 << 20);
    drop(activations);
    assert!(pool
        .alloc_buffer([1 << 30], DType::F32, Scope::Global, Alignment::DEFAULT)
        .is_err());
    drop(backward);
    vec![weights, gradient]
}

#[test]
fn snapshot_pickle_has_pytorch_structure() {
    let pool = recorded_pool();
    let live = exercise(&pool);
    let snapshot = pool.snapshot();
    assert_eq!(
        snapshot.segments.iter().map(|s| s.total_size).sum::<u64>(),
        pool.memory_stats().reserved_bytes.all.current
    );
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("snapshot.pickle");
    snapshot
        .write_pickle(std::fs::File::create(&path).unwrap())
        .unwrap();
    drop(live);
    let output = match Command::new("python3")
        .arg("-c")
        .arg(VALIDATE)
        .arg(&path)
        .output()
    {
        Ok(output) => output,
        Err(error) => {
            headroom_testkit::skip(
                "python3",
                format!("python3 is not available to load the pickle ({error})"),
            );
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "python rejected the snapshot:\n{stdout}\n{stderr}"
    );
    assert!(stdout.starts_with("ok"), "{stdout}");
}

#[test]
fn recorded_trace_replays_from_csv_against_other_configurations() {
    let pool = recorded_pool();
    drop(exercise(&pool));
    let events = pool.snapshot().trace;
    assert!(events.iter().any(|e| e.action == TraceAction::Oom));
    assert!(events.iter().any(|e| e.action == TraceAction::SegmentAlloc));
    let mut csv = Vec::new();
    write_rmm_csv(&events, &mut csv).unwrap();
    let parsed = read_rmm_csv(csv.as_slice()).unwrap();
    let allocations = events
        .iter()
        .filter(|e| e.action == TraceAction::Alloc)
        .count() as u64;
    assert_eq!(
        parsed
            .iter()
            .filter(|e| e.action == TraceAction::Alloc)
            .count() as u64,
        allocations
    );
    assert!(parsed
        .iter()
        .any(|e| e.stage.as_deref() == Some("backward")));

    let device = Arc::new(SimulatedDevice::unbacked(TierCapacities::DATACENTER_GPU));
    let other = MemoryPool::with_config(device, PoolConfig::pytorch()).unwrap();
    let report = replay(&parsed, &other).unwrap();
    assert_eq!(
        (report.allocations, report.ooms, report.live_at_end),
        (allocations, 0, 0)
    );
    assert!(report.stage_peaks.contains_key("forward"));
    let bins = replay(&parsed, PowerOfTwoBins::new()).unwrap();
    assert_eq!(bins.peak_requested, report.peak_requested);
    assert!(bins.peak_reserved >= report.peak_requested);
}
