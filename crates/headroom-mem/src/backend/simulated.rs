//! A device that exists only in memory: fixed capacity per tier and its own address space,
//! so tests and replays can reproduce out-of-memory and fragmentation on any machine.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use super::{Backend, BackendError, BackendKind};
use crate::layout::{align_up, Scope};

/// Capacity in bytes of each tier of a [`SimulatedDevice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierCapacities {
    pub global: u64,
    pub shared: u64,
    pub local: u64,
}

impl TierCapacities {
    /// Roughly an 80 GiB data-centre GPU: 80 GiB HBM, 228 KiB shared memory, 64 KiB local.
    pub const DATACENTER_GPU: TierCapacities = TierCapacities {
        global: 80 << 30,
        shared: 228 << 10,
        local: 64 << 10,
    };

    fn of(&self, scope: Scope) -> u64 {
        match scope {
            Scope::Global => self.global,
            Scope::Shared => self.shared,
            Scope::Local => self.local,
        }
    }
}

/// Zeroed host bytes behind one reservation, held as a raw allocation: copies take raw
/// pointers into it, and a pointer derived from a `&mut Box<[u8]>` would be invalidated by
/// the next reborrow of the same box (Miri caught that for copies within one segment).
#[derive(Debug)]
struct Backing {
    start: *mut u8,
    len: usize,
}

// SAFETY: `Backing` owns its allocation exclusively, like the `Box<[u8]>` it came from.
unsafe impl Send for Backing {}

impl Backing {
    fn zeroed(len: usize) -> Self {
        let bytes: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        Backing {
            start: Box::into_raw(bytes).cast::<u8>(),
            len,
        }
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        let bytes = std::ptr::slice_from_raw_parts_mut(self.start, self.len);
        // SAFETY: `start`/`len` came from `Box::into_raw` in `zeroed` and are freed once.
        drop(unsafe { Box::from_raw(bytes) });
    }
}

/// One live reservation and, on a backed device, its bytes.
#[derive(Debug)]
struct Reservation {
    bytes: u64,
    backing: Option<Backing>,
}

/// One tier's address space: free ranges (first-fit, coalesced) and live reservations.
#[derive(Debug)]
struct Tier {
    capacity: u64,
    free_ranges: BTreeMap<u64, u64>,
    reservations: BTreeMap<u64, Reservation>,
    reserved: u64,
}

impl Tier {
    fn new(base: u64, capacity: u64) -> Self {
        let mut free_ranges = BTreeMap::new();
        if capacity > 0 {
            free_ranges.insert(base, capacity);
        }
        Tier {
            capacity,
            free_ranges,
            reservations: BTreeMap::new(),
            reserved: 0,
        }
    }

    fn take_first_fit(&mut self, bytes: u64, align: u64) -> Option<u64> {
        let (start, len, address) = self.free_ranges.iter().find_map(|(&start, &len)| {
            let address = align_up(start, align);
            (address.checked_add(bytes)? <= start + len).then_some((start, len, address))
        })?;
        self.free_ranges.remove(&start);
        if address > start {
            self.free_ranges.insert(start, address - start);
        }
        let end = address + bytes;
        if end < start + len {
            self.free_ranges.insert(end, start + len - end);
        }
        Some(address)
    }

    fn give_back(&mut self, address: u64, bytes: u64) {
        let mut start = address;
        let mut len = bytes;
        if let Some((&next_start, &next_len)) = self.free_ranges.range(address..).next() {
            if address + bytes == next_start {
                self.free_ranges.remove(&next_start);
                len += next_len;
            }
        }
        if let Some((&prev_start, &prev_len)) = self.free_ranges.range(..address).next_back() {
            if prev_start + prev_len == address {
                self.free_ranges.remove(&prev_start);
                start = prev_start;
                len += prev_len;
            }
        }
        self.free_ranges.insert(start, len);
    }

    /// Pointer to the backing bytes of `address..address+bytes`, checked against reservations.
    fn backing_pointer(&self, address: u64, bytes: u64) -> Result<*mut u8, BackendError> {
        let out_of_bounds = BackendError::OutOfBounds { address, bytes };
        let (&start, reservation) = self
            .reservations
            .range(..=address)
            .next_back()
            .ok_or(out_of_bounds.clone())?;
        let offset = address - start;
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > reservation.bytes)
        {
            return Err(out_of_bounds);
        }
        let backing = reservation.backing.as_ref().ok_or(BackendError::Unbacked)?;
        // SAFETY: offset + bytes <= reservation.bytes == backing.len, checked above.
        Ok(unsafe { backing.start.add(offset as usize) })
    }
}

/// A simulated device with a fixed capacity per tier.
///
/// Segments are placed first-fit in a per-tier address space, so a device whose free bytes
/// are scattered refuses a large segment exactly like a real one does.
#[derive(Debug)]
pub struct SimulatedDevice {
    tiers: Mutex<[Tier; 3]>,
    backed: bool,
}

impl SimulatedDevice {
    /// A device whose segments are backed by host memory, so copies move real bytes.
    pub fn new(capacities: TierCapacities) -> Self {
        Self::build(capacities, true)
    }

    /// A device that only does the accounting (no bytes behind it): for replaying traces of
    /// workloads larger than this machine's RAM. Copies return [`BackendError::Unbacked`].
    pub fn unbacked(capacities: TierCapacities) -> Self {
        Self::build(capacities, false)
    }

    fn build(capacities: TierCapacities, backed: bool) -> Self {
        let tier = |scope: Scope| Tier::new(Self::base_address(scope), capacities.of(scope));
        SimulatedDevice {
            tiers: Mutex::new([tier(Scope::Global), tier(Scope::Shared), tier(Scope::Local)]),
            backed,
        }
    }

    /// First address of a tier's address space; tiers never overlap.
    pub fn base_address(scope: Scope) -> u64 {
        (scope.index() as u64 + 1) << 48
    }

    /// Live reservations of a tier as `(address, bytes)`, in address order.
    pub fn reservations(&self, scope: Scope) -> Vec<(u64, u64)> {
        let tiers = self.tiers.lock();
        tiers[scope.index()]
            .reservations
            .iter()
            .map(|(&a, r)| (a, r.bytes))
            .collect()
    }

    /// Whether `address..address+bytes` lies inside one live reservation.
    pub fn contains(&self, scope: Scope, address: u64, bytes: u64) -> bool {
        let tiers = self.tiers.lock();
        let reservation = tiers[scope.index()]
            .reservations
            .range(..=address)
            .next_back();
        reservation.is_some_and(|(&start, r)| address - start + bytes <= r.bytes)
    }
}

impl Backend for SimulatedDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Simulated
    }

    fn capacity(&self, scope: Scope) -> Option<u64> {
        Some(self.tiers.lock()[scope.index()].capacity)
    }

    fn free_bytes(&self, scope: Scope) -> u64 {
        let tiers = self.tiers.lock();
        let tier = &tiers[scope.index()];
        tier.capacity - tier.reserved
    }

    fn reserve(&self, scope: Scope, bytes: u64, align: u64) -> Result<u64, BackendError> {
        let mut tiers = self.tiers.lock();
        let tier = &mut tiers[scope.index()];
        let exhausted = BackendError::Exhausted {
            scope,
            bytes,
            free: tier.capacity - tier.reserved,
        };
        if bytes == 0 {
            return Err(exhausted);
        }
        let address = tier.take_first_fit(bytes, align).ok_or(exhausted)?;
        let backing = self.backed.then(|| Backing::zeroed(bytes as usize));
        tier.reservations
            .insert(address, Reservation { bytes, backing });
        tier.reserved += bytes;
        Ok(address)
    }

    unsafe fn release(&self, scope: Scope, address: u64, bytes: u64, _align: u64) {
        let mut tiers = self.tiers.lock();
        let tier = &mut tiers[scope.index()];
        if let Some(reservation) = tier.reservations.remove(&address) {
            debug_assert_eq!(reservation.bytes, bytes, "released with a different size");
            tier.reserved -= reservation.bytes;
            tier.give_back(address, reservation.bytes);
        }
    }

    unsafe fn write_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError> {
        let tiers = self.tiers.lock();
        let pointer = tier_of(&tiers, dst)?.backing_pointer(dst, src.len() as u64)?;
        // SAFETY: the range was checked against a live reservation; we hold the lock.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), pointer, src.len()) };
        Ok(())
    }

    unsafe fn read_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        let tiers = self.tiers.lock();
        let pointer = tier_of(&tiers, src)?.backing_pointer(src, dst.len() as u64)?;
        // SAFETY: the range was checked against a live reservation; we hold the lock.
        unsafe { std::ptr::copy_nonoverlapping(pointer, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy_within(&self, dst: u64, src: u64, bytes: u64) -> Result<(), BackendError> {
        let tiers = self.tiers.lock();
        let source = tier_of(&tiers, src)?.backing_pointer(src, bytes)?;
        let destination = tier_of(&tiers, dst)?.backing_pointer(dst, bytes)?;
        // SAFETY: both ranges were checked against live reservations; the caller guarantees
        // they do not overlap; we hold the lock.
        unsafe { std::ptr::copy_nonoverlapping(source, destination, bytes as usize) };
        Ok(())
    }
}

fn tier_of(tiers: &[Tier; 3], address: u64) -> Result<&Tier, BackendError> {
    let index = (address >> 48).wrapping_sub(1) as usize;
    tiers
        .get(index)
        .ok_or(BackendError::OutOfBounds { address, bytes: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_device() -> SimulatedDevice {
        SimulatedDevice::new(TierCapacities {
            global: 4096,
            shared: 1024,
            local: 0,
        })
    }

    #[test]
    fn refuses_beyond_capacity_and_reuses_released_ranges() {
        let device = small_device();
        let a = device.reserve(Scope::Global, 2048, 512).unwrap();
        let b = device.reserve(Scope::Global, 2048, 512).unwrap();
        assert!(matches!(
            device.reserve(Scope::Global, 512, 512),
            Err(BackendError::Exhausted { free: 0, .. })
        ));
        unsafe { device.release(Scope::Global, a, 2048, 512) };
        assert_eq!(device.reserve(Scope::Global, 1024, 512), Ok(a));
        unsafe { device.release(Scope::Global, b, 2048, 512) };
        assert_eq!(device.free_bytes(Scope::Global), 3072);
        assert!(device.reserve(Scope::Local, 1, 1).is_err());
    }

    #[test]
    fn scattered_free_bytes_cannot_hold_a_large_segment() {
        let device = small_device();
        let pieces: Vec<u64> = (0..4)
            .map(|_| device.reserve(Scope::Global, 1024, 512).unwrap())
            .collect();
        unsafe {
            device.release(Scope::Global, pieces[0], 1024, 512);
            device.release(Scope::Global, pieces[2], 1024, 512);
        }
        assert_eq!(device.free_bytes(Scope::Global), 2048);
        assert!(device.reserve(Scope::Global, 2048, 512).is_err());
    }

    #[test]
    fn copies_are_bounds_checked() {
        let device = small_device();
        let a = device.reserve(Scope::Shared, 256, 256).unwrap();
        unsafe {
            device.write_from_host(a + 8, &[1, 2, 3]).unwrap();
            let mut out = [0u8; 4];
            device.read_to_host(a + 7, &mut out).unwrap();
            assert_eq!(out, [0, 1, 2, 3]);
            assert!(device.write_from_host(a + 250, &[0; 7]).is_err());
        }
    }
}
