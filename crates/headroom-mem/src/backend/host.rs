//! Host RAM as a backend: aligned allocations from the global allocator, optionally capped,
//! so CPU code and tests use the same pool and buffers as device code.

use std::alloc::{self, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Backend, BackendError, BackendKind};
use crate::layout::Scope;

/// Aligned host memory. Every tier maps to host RAM, all counted against one optional limit.
#[derive(Debug)]
pub struct HostMemory {
    limit: u64,
    reserved: AtomicU64,
}

impl HostMemory {
    /// Host memory without a limit of its own (the OS still has one).
    pub fn new() -> Self {
        Self::with_limit(u64::MAX)
    }

    /// Host memory that refuses to reserve more than `limit` bytes in total.
    pub fn with_limit(limit: u64) -> Self {
        HostMemory {
            limit,
            reserved: AtomicU64::new(0),
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

impl Backend for HostMemory {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn capacity(&self, _scope: Scope) -> Option<u64> {
        Some(self.limit)
    }

    fn free_bytes(&self, _scope: Scope) -> u64 {
        self.limit
            .saturating_sub(self.reserved.load(Ordering::Relaxed))
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
        let previous = self.reserved.fetch_add(bytes, Ordering::Relaxed);
        if previous
            .checked_add(bytes)
            .is_none_or(|total| total > self.limit)
        {
            self.reserved.fetch_sub(bytes, Ordering::Relaxed);
            return Err(exhausted());
        }
        // SAFETY: the layout has a non-zero size.
        let pointer = unsafe { alloc::alloc(layout) };
        if pointer.is_null() {
            self.reserved.fetch_sub(bytes, Ordering::Relaxed);
            return Err(exhausted());
        }
        Ok(pointer as u64)
    }

    unsafe fn release(&self, _scope: Scope, address: u64, bytes: u64, align: u64) {
        if let Some(layout) = Self::layout(bytes, align) {
            // SAFETY: the caller guarantees this is a live reservation made with this layout.
            unsafe { alloc::dealloc(address as *mut u8, layout) };
        }
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }

    unsafe fn write_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees the destination range is live and exclusive.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn read_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees the source range is live.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy_within(&self, dst: u64, src: u64, bytes: u64) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees both ranges are live and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes as usize) };
        Ok(())
    }
}
