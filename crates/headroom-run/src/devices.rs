//! Accelerator memory for `headroom run`: NVIDIA GPUs through NVML (loaded at run time) and AWS
//! Neuron devices through `neuron-monitor`, each skipped with a note where absent.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use headroom_probe::neuron::NeuronMonitor;
use headroom_probe::nvml::Nvml;

/// NVML process queries take about a millisecond: at most this often, whatever the interval.
const GPU_EVERY: Duration = Duration::from_millis(200);
/// A stage start asks for a reading of its own sooner, but never sooner than this after the
/// last one, however many stages a `--stage-regex` starts a second.
const GPU_STAGE_GAP: Duration = Duration::from_millis(20);

/// Device memory of the tree at one sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceReading {
    pub gpu: Option<u64>,
    /// When NVML was read for `gpu`: up to `GPU_EVERY` before the sample.
    pub gpu_read_at: Option<Instant>,
    pub neuron: Option<u64>,
}

/// The accelerators this machine has, opened once for the whole `headroom run`.
pub struct Devices {
    nvml: Option<Nvml>,
    neuron: Option<NeuronMonitor>,
    notes: Vec<String>,
    /// The last NVML reading: when, and the bytes the tree held.
    last_gpu: Option<(Instant, u64)>,
    /// When the latest stage started.
    stage_started: Option<Instant>,
}

impl Devices {
    pub fn open() -> Devices {
        let mut notes = Vec::new();
        let nvml = match Nvml::load() {
            Ok(nvml) if nvml.device_count() > 0 => Some(nvml),
            Ok(_) => {
                notes
                    .push("NVML loaded but reports no GPU; GPU memory is not recorded".to_string());
                None
            }
            Err(e) => {
                notes.push(e.to_string());
                None
            }
        };
        let neuron = NeuronMonitor::start();
        Devices {
            nvml,
            neuron,
            notes,
            last_gpu: None,
            stage_started: None,
        }
    }

    /// Processes headroom itself started for sampling, which are not part of the command's tree.
    pub fn helper_pids(&self) -> Vec<i32> {
        self.neuron.iter().map(NeuronMonitor::pid).collect()
    }

    pub fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    /// A stage started: the next read asks NVML again (after `GPU_STAGE_GAP`), so the new
    /// stage gets a reading of its own at once rather than up to `GPU_EVERY` later.
    pub fn stage_started(&mut self) {
        self.stage_started = Some(Instant::now());
    }

    /// Device memory held by `pids`.
    pub fn read(&mut self, pids: &HashSet<i32>) -> DeviceReading {
        let stage_started = self.stage_started;
        let still_current = |at: Instant| {
            at.elapsed() < GPU_STAGE_GAP
                || (at.elapsed() < GPU_EVERY && stage_started.is_none_or(|start| at >= start))
        };
        let gpu = self.nvml.as_ref().map(|nvml| match self.last_gpu {
            Some((at, bytes)) if still_current(at) => (at, bytes),
            _ => {
                let bytes = nvml
                    .processes()
                    .iter()
                    .filter(|p| pids.contains(&p.pid))
                    .map(|p| p.bytes)
                    .sum();
                let reading = (Instant::now(), bytes);
                self.last_gpu = Some(reading);
                reading
            }
        });
        let neuron = self.neuron.as_ref().map(|monitor| {
            monitor
                .latest()
                .iter()
                .filter(|(pid, _)| pids.contains(pid))
                .map(|(_, b)| *b)
                .sum()
        });
        DeviceReading {
            gpu: gpu.map(|(_, bytes)| bytes),
            gpu_read_at: gpu.map(|(at, _)| at),
            neuron,
        }
    }
}
