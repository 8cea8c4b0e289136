//! Allocation history for hunting leaks and fragmentation: events with stage annotations,
//! exported as a PyTorch memory snapshot pickle (open it at pytorch.org/memory_viz) or an
//! RMM-style CSV log, and read back from CSV for the replayer.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde_pickle::{HashableValue, SerOptions, Value};

use crate::layout::Scope;
use crate::stats::PoolKind;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceAction {
    /// A block was handed to a buffer.
    Alloc,
    /// A buffer's block came back.
    Free,
    /// A segment was reserved from the backend.
    SegmentAlloc,
    /// A segment was released to the backend.
    SegmentFree,
    /// An allocation failed after releasing the cache.
    Oom,
}

impl TraceAction {
    fn rmm_name(self) -> Option<&'static str> {
        match self {
            TraceAction::Alloc => Some("allocate"),
            TraceAction::Free => Some("free"),
            TraceAction::Oom => Some("allocate failure"),
            TraceAction::SegmentAlloc | TraceAction::SegmentFree => None,
        }
    }

    fn from_rmm_name(name: &str) -> Option<Self> {
        match name {
            "allocate" => Some(TraceAction::Alloc),
            "free" => Some(TraceAction::Free),
            "allocate failure" => Some(TraceAction::Oom),
            _ => None,
        }
    }
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    pub action: TraceAction,
    pub scope: Scope,
    /// Block or segment address (0 for an OOM).
    pub address: u64,
    /// Block or segment bytes after rounding.
    pub size: u64,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Microseconds since the pool was created.
    pub time_us: u64,
    /// Small number identifying the recording thread.
    pub thread: u64,
    /// Stage annotation active when the event happened.
    pub stage: Option<Arc<str>>,
    /// Unreserved device bytes, for OOM events.
    pub device_free: Option<u64>,
}

impl TraceEvent {
    /// A bare allocation or free event, as a workload generator writes it.
    pub fn new(action: TraceAction, address: u64, requested: u64, stage: Option<Arc<str>>) -> Self {
        TraceEvent {
            action,
            scope: Scope::Global,
            address,
            size: requested,
            requested,
            time_us: 0,
            thread: 0,
            stage,
            device_free: None,
        }
    }
}

/// Collects events while a pool runs with `record_trace`.
#[derive(Debug)]
pub(crate) struct Recorder {
    start: Instant,
    events: Mutex<Vec<TraceEvent>>,
    stage: Mutex<Option<Arc<str>>>,
}

fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    NUMBER.with(|number| *number)
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Recorder {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
            stage: Mutex::new(None),
        }
    }

    pub(crate) fn record(
        &self,
        action: TraceAction,
        scope: Scope,
        address: u64,
        size: u64,
        requested: u64,
        device_free: Option<u64>,
    ) {
        let event = TraceEvent {
            action,
            scope,
            address,
            size,
            requested,
            time_us: self.start.elapsed().as_micros() as u64,
            thread: thread_number(),
            stage: self.stage.lock().clone(),
            device_free,
        };
        self.events.lock().push(event);
    }

    pub(crate) fn events(&self) -> Vec<TraceEvent> {
        self.events.lock().clone()
    }
}

/// Restores the previous stage annotation when dropped.
#[derive(Debug)]
#[must_use = "the stage ends when the guard is dropped"]
pub struct StageGuard<'pool> {
    recorder: Option<&'pool Recorder>,
    previous: Option<Arc<str>>,
}

impl<'pool> StageGuard<'pool> {
    pub(crate) fn enter(recorder: Option<&'pool Recorder>, name: &str) -> Self {
        let previous = recorder.and_then(|r| r.stage.lock().replace(Arc::from(name)));
        StageGuard { recorder, previous }
    }
}

impl Drop for StageGuard<'_> {
    fn drop(&mut self) {
        if let Some(recorder) = self.recorder {
            *recorder.stage.lock() = self.previous.take();
        }
    }
}

/// Whether a block is in use, as PyTorch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    ActiveAllocated,
    Inactive,
}

impl BlockState {
    fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSnapshot {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
}

/// One segment reserved from the backend, with its blocks in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSnapshot {
    pub scope: Scope,
    pub address: u64,
    pub total_size: u64,
    pub kind: PoolKind,
    pub blocks: Vec<BlockSnapshot>,
}

/// The pool's state and history, shaped like `torch.cuda.memory._snapshot()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub device: u32,
    pub segments: Vec<SegmentSnapshot>,
    pub trace: Vec<TraceEvent>,
}

/// Why a trace could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("could not write the snapshot pickle: {0}")]
    Pickle(#[from] serde_pickle::Error),
    #[error("could not read or write the CSV trace: {0}")]
    Csv(#[from] csv::Error),
    #[error("CSV trace line {line}: {reason}; expected RMM columns Thread,Time,Action,Pointer,Size,Stream (and optionally Scope,Stage)")]
    Malformed { line: u64, reason: String },
}

fn dict<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Dict(
        entries
            .into_iter()
            .map(|(key, value)| (HashableValue::String(key.into()), value))
            .collect(),
    )
}

fn int(value: u64) -> Value {
    Value::I64(i64::try_from(value).unwrap_or(i64::MAX))
}

/// The call stack of an event: its stage annotation as a single frame, so memory_viz shows it.
fn frames(stage: Option<&str>) -> Value {
    let frames = stage.map(|stage| {
        dict([
            ("filename", Value::String("headroom-mem stage".into())),
            ("line", Value::I64(0)),
            ("name", Value::String(stage.into())),
        ])
    });
    Value::List(frames.into_iter().collect())
}

impl Snapshot {
    /// The snapshot as Python values: a dict with `segments`, `device_traces` and
    /// `allocator_settings`, the structure `torch.cuda.memory._snapshot()` returns.
    pub fn to_pickle_value(&self) -> Value {
        let segments = self.segments.iter().map(|segment| {
            let sum = |f: fn(&BlockSnapshot) -> u64| {
                let allocated = segment
                    .blocks
                    .iter()
                    .filter(|b| b.state == BlockState::ActiveAllocated);
                int(allocated.map(f).sum())
            };
            let blocks = segment.blocks.iter().map(|block| {
                dict([
                    ("address", int(block.address)),
                    ("size", int(block.size)),
                    ("requested_size", int(block.requested_size)),
                    ("state", Value::String(block.state.name().into())),
                    ("frames", Value::List(Vec::new())),
                ])
            });
            dict([
                ("device", int(u64::from(self.device))),
                ("address", int(segment.address)),
                ("total_size", int(segment.total_size)),
                ("allocated_size", sum(|b| b.size)),
                ("active_size", sum(|b| b.size)),
                ("requested_size", sum(|b| b.requested_size)),
                ("stream", Value::I64(0)),
                ("segment_type", Value::String(segment.kind.name().into())),
                (
                    "segment_pool_id",
                    Value::Tuple(vec![Value::I64(0), Value::I64(0)]),
                ),
                ("is_expandable", Value::Bool(false)),
                ("frames", Value::List(Vec::new())),
                ("memory_tier", Value::String(segment.scope.name().into())),
                ("blocks", Value::List(blocks.collect())),
            ])
        });
        let mut trace = Vec::new();
        for event in &self.trace {
            let actions: &[&str] = match event.action {
                TraceAction::Alloc => &["alloc"],
                TraceAction::Free => &["free_requested", "free_completed"],
                TraceAction::SegmentAlloc => &["segment_alloc"],
                TraceAction::SegmentFree => &["segment_free"],
                TraceAction::Oom => &["oom"],
            };
            for action in actions {
                let mut entry = dict([
                    ("action", Value::String((*action).into())),
                    ("addr", int(event.address)),
                    ("size", int(event.size)),
                    ("requested_size", int(event.requested)),
                    ("stream", Value::I64(0)),
                    ("time_us", int(event.time_us)),
                    ("frames", frames(event.stage.as_deref())),
                    ("memory_tier", Value::String(event.scope.name().into())),
                ]);
                if let (Value::Dict(map), Some(free)) = (&mut entry, event.device_free) {
                    map.insert(HashableValue::String("device_free".into()), int(free));
                }
                trace.push(entry);
            }
        }
        let device_count = self.device as usize + 1;
        let mut device_traces = vec![Value::List(Vec::new()); device_count];
        device_traces[self.device as usize] = Value::List(trace);
        dict([
            ("segments", Value::List(segments.collect())),
            ("device_traces", Value::List(device_traces)),
            (
                "allocator_settings",
                dict([
                    ("PYTORCH_CUDA_ALLOC_CONF", Value::String(String::new())),
                    ("max_split_size", Value::I64(-1)),
                    ("garbage_collection_threshold", Value::F64(0.0)),
                    ("expandable_segments", Value::Bool(false)),
                ]),
            ),
        ])
    }

    /// Writes the snapshot pickle (what `torch.cuda.memory._dump_snapshot` writes).
    pub fn write_pickle(&self, mut writer: impl Write) -> Result<(), TraceError> {
        serde_pickle::value_to_writer(&mut writer, &self.to_pickle_value(), SerOptions::new())?;
        Ok(())
    }
}

const RMM_HEADER: [&str; 8] = [
    "Thread", "Time", "Action", "Pointer", "Size", "Stream", "Scope", "Stage",
];

fn rmm_time(time_us: u64) -> String {
    let seconds = time_us / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        time_us % 1_000_000
    )
}

/// Writes allocation, free and failure events as an RMM `logging_resource_adaptor` CSV
/// (`Thread,Time,Action,Pointer,Size,Stream`), plus `Scope` and `Stage` columns. `Size` is
/// the requested size; segment events are left out, as RMM logs only what callers asked.
pub fn write_rmm_csv(events: &[TraceEvent], writer: impl Write) -> Result<(), TraceError> {
    let mut csv = csv::Writer::from_writer(writer);
    csv.write_record(RMM_HEADER)?;
    for event in events {
        let Some(action) = event.action.rmm_name() else {
            continue;
        };
        csv.write_record([
            event.thread.to_string().as_str(),
            &rmm_time(event.time_us),
            action,
            &format!("{:#x}", event.address),
            &event.requested.to_string(),
            "0",
            event.scope.name(),
            event.stage.as_deref().unwrap_or(""),
        ])?;
    }
    csv.flush().map_err(csv::Error::from)?;
    Ok(())
}

/// Reads a CSV written by [`write_rmm_csv`] or by RMM itself (without the extra columns).
pub fn read_rmm_csv(reader: impl Read) -> Result<Vec<TraceEvent>, TraceError> {
    let mut csv = csv::Reader::from_reader(reader);
    let headers = csv.headers()?.clone();
    let column = |name: &str| headers.iter().position(|h| h.trim() == name);
    let malformed = |line, reason: String| TraceError::Malformed { line, reason };
    let (action, pointer, size) = match (column("Action"), column("Pointer"), column("Size")) {
        (Some(a), Some(p), Some(s)) => (a, p, s),
        _ => {
            return Err(malformed(
                1,
                "the header lacks Action, Pointer or Size".into(),
            ))
        }
    };
    let (scope, stage) = (column("Scope"), column("Stage"));
    let mut stages: BTreeMap<String, Arc<str>> = BTreeMap::new();
    let mut events = Vec::new();
    for record in csv.records() {
        let record = record?;
        let line = record.position().map_or(0, |p| p.line());
        let field = |index: usize| record.get(index).unwrap_or("").trim();
        let action = TraceAction::from_rmm_name(field(action))
            .ok_or_else(|| malformed(line, format!("unknown action `{}`", field(action))))?;
        let text = field(pointer);
        let address = u64::from_str_radix(text.trim_start_matches("0x"), 16)
            .map_err(|_| malformed(line, format!("pointer `{text}` is not hexadecimal")))?;
        let requested: u64 = field(size)
            .parse()
            .map_err(|_| malformed(line, format!("size `{}` is not a number", field(size))))?;
        let scope = match scope.map(field) {
            None | Some("") => Scope::Global,
            Some(name) => Scope::from_name(name)
                .ok_or_else(|| malformed(line, format!("unknown scope `{name}`")))?,
        };
        let stage = stage.map(field).filter(|s| !s.is_empty()).map(|name| {
            stages
                .entry(name.to_string())
                .or_insert_with(|| Arc::from(name))
                .clone()
        });
        events.push(TraceEvent {
            scope,
            ..TraceEvent::new(action, address, requested, stage)
        });
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trips_allocations_and_stages() {
        let stage: Option<Arc<str>> = Some(Arc::from("attention"));
        let events = vec![
            TraceEvent::new(TraceAction::Alloc, 0x1000, 4096, stage.clone()),
            TraceEvent::new(TraceAction::Free, 0x1000, 4096, None),
        ];
        let mut bytes = Vec::new();
        write_rmm_csv(&events, &mut bytes).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.starts_with("Thread,Time,Action,Pointer,Size,Stream"),
            "{text}"
        );
        assert!(
            text.contains("allocate,0x1000,4096,0,global,attention"),
            "{text}"
        );
        assert_eq!(read_rmm_csv(bytes.as_slice()).unwrap(), events);
    }

    #[test]
    fn malformed_csv_names_the_line() {
        let text = "Thread,Time,Action,Pointer,Size,Stream\n0,00:00:00.0,allocate,zz,12,0\n";
        let error = read_rmm_csv(text.as_bytes()).unwrap_err().to_string();
        assert!(
            error.contains("line 2") && error.contains("hexadecimal"),
            "{error}"
        );
    }

    #[test]
    fn rmm_time_is_clock_formatted() {
        assert_eq!(rmm_time(3_723_000_042), "01:02:03.000042");
    }
}
