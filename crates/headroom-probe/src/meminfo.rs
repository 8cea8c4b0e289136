//! System-wide memory from `/proc/meminfo`: what the kernel says it could hand out right now.

use crate::ProbeError;

/// The system's memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub total: u64,
    /// `MemAvailable`: memory a new workload can get without swapping.
    pub available: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

/// Reads `/proc/meminfo`.
pub fn read_meminfo() -> Result<MemInfo, ProbeError> {
    use procfs::Current;
    let raw = procfs::Meminfo::current()?;
    Ok(MemInfo {
        total: raw.mem_total,
        // Kernels before 3.14 lack MemAvailable; free + page cache is the old approximation.
        available: raw
            .mem_available
            .unwrap_or(raw.mem_free + raw.cached + raw.buffers),
        swap_total: raw.swap_total,
        swap_free: raw.swap_free,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_plausible_numbers() {
        let info = read_meminfo().unwrap();
        assert!(info.total > 64 << 20, "{info:?}");
        assert!(info.available <= info.total, "{info:?}");
        assert!(info.swap_free <= info.swap_total, "{info:?}");
    }
}
