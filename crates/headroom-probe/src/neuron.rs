//! AWS Neuron device memory per process, read from `neuron-monitor`'s JSON reports when the
//! tool is on PATH (Neuron SDK machines). The monitor runs as a helper process that prints one
//! JSON report per period; the latest report is kept.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// Neuron device memory by process id, from one report.
pub fn parse_report(json: &str) -> Option<HashMap<i32, u64>> {
    let report: serde_json::Value = serde_json::from_str(json).ok()?;
    let runtimes = report.get("neuron_runtime_data")?.as_array()?;
    Some(
        runtimes
            .iter()
            .filter_map(|runtime| {
                let pid = runtime.get("pid")?.as_i64()? as i32;
                let bytes = runtime
                    .pointer("/report/memory_used/neuron_runtime_used_bytes/neuron_device")?
                    .as_u64()?;
                Some((pid, bytes))
            })
            .collect(),
    )
}

/// A running `neuron-monitor` and its latest reading.
pub struct NeuronMonitor {
    child: Child,
    latest: Arc<Mutex<HashMap<i32, u64>>>,
}

impl NeuronMonitor {
    /// Starts `neuron-monitor`; `None` when it is not on PATH.
    pub fn start() -> Option<NeuronMonitor> {
        let mut child = Command::new("neuron-monitor")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let stdout = child.stdout.take()?;
        let latest = Arc::new(Mutex::new(HashMap::new()));
        let shared = Arc::clone(&latest);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(reading) = parse_report(&line) {
                    if let Ok(mut latest) = shared.lock() {
                        *latest = reading;
                    }
                }
            }
        });
        Some(NeuronMonitor { child, latest })
    }

    /// The helper's pid, so process-tree sampling can leave it out.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Device memory by process id, from the latest report.
    pub fn latest(&self) -> HashMap<i32, u64> {
        self.latest.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for NeuronMonitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_device_memory_per_runtime() {
        let json = r#"{"neuron_runtime_data":[{"pid":4242,"neuron_runtime_tag":"1","error":"","report":{"memory_used":{"period":1.0,"neuron_runtime_used_bytes":{"host":1000,"neuron_device":5368709120}}}},{"pid":7,"error":"gone","report":{}}],"system_data":{}}"#;
        let reading = parse_report(json).unwrap();
        assert_eq!(reading.get(&4242), Some(&5_368_709_120));
        assert_eq!(reading.len(), 1);
    }

    #[test]
    fn rejects_other_json() {
        assert_eq!(parse_report("{}"), None);
        assert_eq!(parse_report("not json"), None);
    }
}
