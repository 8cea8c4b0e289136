//! Accelerator memory for `headroom run`: NVIDIA GPUs through NVML (loaded at run time) and AWS
//! Neuron devices through `neuron-monitor`, each skipped with a note where absent.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use headroom_probe::neuron::NeuronMonitor;
use headroom_probe::nvml::Nvml;

/// NVML process queries take about a millisecond: at most this often, whatever the interval.
const GPU_EVERY: Duration = Duration::from_millis(200);

/// Device memory of the tree at one sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceReading {
    pub gpu: Option<u64>,
    pub neuron: Option<u64>,
}

/// The accelerators this machine has, opened once for the whole `headroom run`.
pub struct Devices {
    nvml: Option<Nvml>,
    neuron: Option<NeuronMonitor>,
    notes: Vec<String>,
    last_gpu: Option<(Instant, Option<u64>)>,
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
        }
    }

    /// Processes headroom itself started for sampling, which are not part of the command's tree.
    pub fn helper_pids(&self) -> Vec<i32> {
        self.neuron.iter().map(NeuronMonitor::pid).collect()
    }

    pub fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    /// Device memory held by `pids`.
    pub fn read(&mut self, pids: &HashSet<i32>) -> DeviceReading {
        let gpu = self.nvml.as_ref().and_then(|nvml| match self.last_gpu {
            Some((at, value)) if at.elapsed() < GPU_EVERY => value,
            _ => {
                let value = Some(
                    nvml.processes()
                        .iter()
                        .filter(|p| pids.contains(&p.pid))
                        .map(|p| p.bytes)
                        .sum(),
                );
                self.last_gpu = Some((Instant::now(), value));
                value
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
        DeviceReading { gpu, neuron }
    }
}
