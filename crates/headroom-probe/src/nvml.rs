//! GPU memory per process through NVML, loaded at run time (`libnvidia-ml.so.1`) so headroom
//! builds and runs on machines without the NVIDIA driver; there it reports why GPU memory is
//! not shown instead of failing.

use std::ffi::{c_int, c_uint, c_void};

use libloading::Library;

/// NVML is not usable here.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("NVML is not available ({0}); GPU memory is not recorded. It comes with the NVIDIA driver as libnvidia-ml.so.1")]
    NotInstalled(String),
    #[error("NVML call {call} failed with status {status}")]
    Call { call: &'static str, status: c_int },
}

type Device = *mut c_void;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlProcessInfo_t` as of the `_v2`/`_v3` calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

type InitFn = unsafe extern "C" fn() -> c_int;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> c_int;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
type MemoryFn = unsafe extern "C" fn(Device, *mut Memory) -> c_int;
type ProcessesFn = unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> c_int;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;
/// NVML reports this when a process's usage is not available (e.g. without privileges).
const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// One device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceMemory {
    pub index: u32,
    pub total: u64,
    pub used: u64,
}

/// GPU memory one process holds on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: i32,
    pub device: u32,
    pub bytes: u64,
}

/// A loaded and initialised NVML.
pub struct Nvml {
    devices: Vec<Device>,
    memory_info: MemoryFn,
    running_processes: ProcessesFn,
    shutdown: InitFn,
    // Keeps the function pointers above valid; dropped last.
    _library: Library,
}

impl Nvml {
    /// Loads `libnvidia-ml.so.1` and initialises it.
    pub fn load() -> Result<Nvml, NvmlError> {
        // SAFETY: loading the vendor's NVML runs its initialisers, which is what every NVML user
        // does; the symbols are looked up with their documented C signatures.
        unsafe {
            let library = Library::new("libnvidia-ml.so.1")
                .map_err(|e| NvmlError::NotInstalled(e.to_string()))?;
            let symbol = |name: &[u8]| -> Result<*mut c_void, NvmlError> {
                library
                    .get::<*mut c_void>(name)
                    .map(|s| *s)
                    .map_err(|e| NvmlError::NotInstalled(e.to_string()))
            };
            let init: InitFn = std::mem::transmute(symbol(b"nvmlInit_v2\0")?);
            let shutdown: InitFn = std::mem::transmute(symbol(b"nvmlShutdown\0")?);
            let count: CountFn = std::mem::transmute(symbol(b"nvmlDeviceGetCount_v2\0")?);
            let handle: HandleFn = std::mem::transmute(symbol(b"nvmlDeviceGetHandleByIndex_v2\0")?);
            let memory_info: MemoryFn = std::mem::transmute(symbol(b"nvmlDeviceGetMemoryInfo\0")?);
            let running_processes: ProcessesFn = std::mem::transmute(
                symbol(b"nvmlDeviceGetComputeRunningProcesses_v3\0")
                    .or_else(|_| symbol(b"nvmlDeviceGetComputeRunningProcesses_v2\0"))?,
            );
            check("nvmlInit_v2", init())?;
            let mut devices_found: c_uint = 0;
            check("nvmlDeviceGetCount_v2", count(&mut devices_found))?;
            let mut devices = Vec::new();
            for index in 0..devices_found {
                let mut device: Device = std::ptr::null_mut();
                check("nvmlDeviceGetHandleByIndex_v2", handle(index, &mut device))?;
                devices.push(device);
            }
            Ok(Nvml {
                devices,
                memory_info,
                running_processes,
                shutdown,
                _library: library,
            })
        }
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Total and used memory of every device.
    pub fn devices(&self) -> Vec<DeviceMemory> {
        self.devices
            .iter()
            .enumerate()
            .filter_map(|(index, &device)| {
                let mut memory = Memory::default();
                // SAFETY: `device` came from NVML and `memory` is a valid out-pointer.
                let status = unsafe { (self.memory_info)(device, &mut memory) };
                (status == NVML_SUCCESS).then_some(DeviceMemory {
                    index: index as u32,
                    total: memory.total,
                    used: memory.used,
                })
            })
            .collect()
    }

    /// GPU memory held by each compute process on each device.
    pub fn processes(&self) -> Vec<ProcessMemory> {
        let mut all = Vec::new();
        for (index, &device) in self.devices.iter().enumerate() {
            let mut capacity: c_uint = 16;
            loop {
                let mut infos = vec![ProcessInfo::default(); capacity as usize];
                let mut count = capacity;
                // SAFETY: `infos` has room for `count` entries, as NVML is told.
                let status =
                    unsafe { (self.running_processes)(device, &mut count, infos.as_mut_ptr()) };
                if status == NVML_ERROR_INSUFFICIENT_SIZE && capacity < 4096 {
                    capacity = count.max(capacity * 2);
                    continue;
                }
                if status == NVML_SUCCESS {
                    all.extend(
                        infos[..count as usize]
                            .iter()
                            .filter(|i| i.used_gpu_memory != NVML_VALUE_NOT_AVAILABLE)
                            .map(|info| ProcessMemory {
                                pid: info.pid as i32,
                                device: index as u32,
                                bytes: info.used_gpu_memory,
                            }),
                    );
                }
                break;
            }
        }
        all
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balanced with the successful nvmlInit_v2 in `load`.
        unsafe {
            (self.shutdown)();
        }
    }
}

fn check(call: &'static str, status: c_int) -> Result<(), NvmlError> {
    if status == NVML_SUCCESS {
        Ok(())
    } else {
        Err(NvmlError::Call { call, status })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_where_the_driver_is_and_explains_where_not() {
        match Nvml::load() {
            Ok(nvml) => {
                let devices = nvml.devices();
                assert_eq!(devices.len(), nvml.device_count());
                assert!(devices.iter().all(|d| d.total >= d.used));
                let _ = nvml.processes();
            }
            Err(e) => {
                let message = e.to_string();
                assert!(message.contains("libnvidia-ml.so.1"), "{message}");
                headroom_testkit::skip("gpu", message);
            }
        }
    }
}
