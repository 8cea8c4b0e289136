//! Host RAM as a backend: aligned allocations from the global allocator, optionally capped,
//! so CPU code and tests use the same pool and buffers as device code. Eviction hands the
//! whole pages of a range back to the kernel (`madvise(MADV_DONTNEED)`), so an offloaded
//! range stops counting in the process's resident memory.

use std::alloc::{self, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Backend, BackendError, BackendKind};
use crate::layout::Scope;

/// Aligned host memory. Every tier maps to host RAM, all counted against one optional limit.
#[derive(Debug)]
pub struct HostMemory {
    limit: Limit,
}

impl HostMemory {
    /// Host memory without a limit of its own (the OS still has one).
    pub fn new() -> Self {
        Self::with_limit(u64::MAX)
    }

    /// Host memory that refuses to reserve more than `limit` bytes in total.
    pub fn with_limit(limit: u64) -> Self {
        HostMemory {
            limit: Limit::new(limit),
        }
    }

    fn layout(bytes: u64, align: u64) -> Option<Layout> {
        Layout::from_size_align(usize::try_from(bytes).ok()?, usize::try_from(align).ok()?).ok()
    }
}

impl Default for HostMemory {
    fn default() -> Self {
        Self::new()
    }
}

/// Bytes reserved against an optional limit, for the backends whose memory is host RAM.
#[derive(Debug)]
pub(super) struct Limit {
    limit: u64,
    reserved: AtomicU64,
}

impl Limit {
    pub(super) fn new(limit: u64) -> Self {
        Limit {
            limit,
            reserved: AtomicU64::new(0),
        }
    }

    pub(super) fn capacity(&self) -> u64 {
        self.limit
    }

    pub(super) fn free(&self) -> u64 {
        self.limit
            .saturating_sub(self.reserved.load(Ordering::Relaxed))
    }

    /// Counts `bytes` as reserved, or returns `false` when they would pass the limit.
    pub(super) fn take(&self, bytes: u64) -> bool {
        let previous = self.reserved.fetch_add(bytes, Ordering::Relaxed);
        let fits = previous
            .checked_add(bytes)
            .is_some_and(|total| total <= self.limit);
        if !fits {
            self.give_back(bytes);
        }
        fits
    }

    pub(super) fn give_back(&self, bytes: u64) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Copies for memory the CPU addresses directly: plain `memcpy`.
pub(super) mod direct {
    /// # Safety
    /// The destination range must be live and exclusive.
    pub unsafe fn write(dst: u64, src: &[u8]) {
        // SAFETY: forwarded from the caller.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
    }

    /// # Safety
    /// The source range must be live.
    pub unsafe fn read(src: u64, dst: &mut [u8]) {
        // SAFETY: forwarded from the caller.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
    }

    /// # Safety
    /// Both ranges must be live and must not overlap; `dst` must be exclusive.
    pub unsafe fn within(dst: u64, src: u64, bytes: u64) {
        // SAFETY: forwarded from the caller.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes as usize) };
    }
}

impl Backend for HostMemory {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn capacity(&self, _scope: Scope) -> Option<u64> {
        Some(self.limit.capacity())
    }

    fn free_bytes(&self, _scope: Scope) -> u64 {
        self.limit.free()
    }

    fn host_accessible(&self) -> bool {
        true
    }

    fn reserve(&self, scope: Scope, bytes: u64, align: u64) -> Result<u64, BackendError> {
        let exhausted = || BackendError::Exhausted {
            scope,
            bytes,
            free: self.free_bytes(scope),
        };
        let layout = Self::layout(bytes, align)
            .filter(|l| l.size() > 0)
            .ok_or_else(exhausted)?;
        if !self.limit.take(bytes) {
            return Err(exhausted());
        }
        // SAFETY: the layout has a non-zero size.
        let pointer = unsafe { alloc::alloc(layout) };
        if pointer.is_null() {
            self.limit.give_back(bytes);
            return Err(exhausted());
        }
        Ok(pointer as u64)
    }

    unsafe fn release(&self, _scope: Scope, address: u64, bytes: u64, align: u64) {
        if let Some(layout) = Self::layout(bytes, align) {
            // SAFETY: the caller guarantees this is a live reservation made with this layout.
            unsafe { alloc::dealloc(address as *mut u8, layout) };
        }
        self.limit.give_back(bytes);
    }

    unsafe fn write_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees the destination range is live and exclusive.
        unsafe { direct::write(dst, src) };
        Ok(())
    }

    unsafe fn read_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees the source range is live.
        unsafe { direct::read(src, dst) };
        Ok(())
    }

    unsafe fn copy_within(&self, dst: u64, src: u64, bytes: u64) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees both ranges are live and do not overlap.
        unsafe { direct::within(dst, src, bytes) };
        Ok(())
    }

    unsafe fn evict(&self, _scope: Scope, address: u64, bytes: u64) -> Result<(), BackendError> {
        let page = page_size();
        let start = address.next_multiple_of(page);
        let end = (address + bytes) / page * page;
        if end > start {
            // SAFETY: the caller guarantees the range is a live reservation of ours that
            // nobody accesses; whole pages inside it belong to no other allocation.
            let failed = unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    (end - start) as usize,
                    libc::MADV_DONTNEED,
                )
            } != 0;
            if failed {
                let error = std::io::Error::last_os_error();
                return Err(BackendError::Driver(format!(
                    "madvise(MADV_DONTNEED): {error}"
                )));
            }
        }
        Ok(())
    }

    unsafe fn restore(
        &self,
        _scope: Scope,
        _address: u64,
        _bytes: u64,
    ) -> Result<(), BackendError> {
        // Pages given back with MADV_DONTNEED return, zero-filled, when next touched.
        Ok(())
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096).max(1)
}
