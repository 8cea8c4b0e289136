//! The CUDA backend on a real GPU: a pool round trip through device memory. Built only with
//! `--features cuda`; skips with a reason where no driver or device exists.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use headroom_mem::*;

#[test]
fn pool_round_trips_bytes_through_gpu_memory() {
    let device = match CudaDevice::new(0) {
        Ok(device) => Arc::new(device),
        Err(error) => {
            headroom_testkit::skip("gpu", format!("no usable CUDA device ({error})"));
            return;
        }
    };
    assert!(device
        .capacity(Scope::Global)
        .is_some_and(|bytes| bytes > 0));
    assert!(matches!(
        device.reserve(Scope::Shared, 1024, 256),
        Err(BackendError::UnsupportedScope { .. })
    ));
    let pool = MemoryPool::new(device);
    let data: Vec<f32> = (0..1 << 20).map(|v| v as f32).collect();
    let mut first = pool
        .alloc_buffer(
            [1 << 20],
            DType::F32,
            Scope::Global,
            Alignment::new(4096).unwrap(),
        )
        .unwrap();
    let mut second = pool
        .alloc_buffer([1024, 1024], DType::F32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    assert!(is_aligned(&first, Alignment::new(4096).unwrap()));
    copy_from_host(&mut first, &data).unwrap();
    copy(&mut second, &first).unwrap();
    let mut read = vec![0f32; 1 << 20];
    copy_to_host(&second, &mut read).unwrap();
    assert_eq!(read, data);
    drop((first, second));
    pool.empty_cache();
    assert_eq!(pool.memory_stats().reserved_bytes.all.current, 0);
}

fn device_or_skip(open: fn(u32) -> Result<CudaDevice, BackendError>) -> Option<Arc<CudaDevice>> {
    match open(0) {
        Ok(device) => Some(Arc::new(device)),
        Err(error) => {
            headroom_testkit::skip("gpu", format!("no usable CUDA device ({error})"));
            None
        }
    }
}

#[test]
fn pinned_buffers_copy_to_and_from_the_device() {
    let Some(device) = device_or_skip(CudaDevice::new) else {
        return;
    };
    let pinned = MemoryPool::new(Arc::new(PinnedHostMemory::new(Arc::clone(&device))));
    let gpu = MemoryPool::new(device);
    let data: Vec<i32> = (0..1 << 22).collect();
    let mut staged = pinned
        .alloc_buffer([1 << 22], DType::I32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    copy_from_host(&mut staged, &data).unwrap();
    let mut on_gpu = gpu
        .alloc_buffer([1 << 22], DType::I32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    copy(&mut on_gpu, &staged).unwrap();
    let mut back = pinned
        .alloc_buffer([1 << 22], DType::I32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    copy(&mut back, &on_gpu).unwrap();
    let mut read = vec![0i32; 1 << 22];
    copy_to_host(&back, &mut read).unwrap();
    assert_eq!(read, data);
}

#[test]
fn an_evictable_segment_is_offloaded_and_restored_at_its_address() {
    let Some(device) = device_or_skip(CudaDevice::evictable) else {
        return;
    };
    let pinned = MemoryPool::new(Arc::new(PinnedHostMemory::new(Arc::clone(&device))));
    let device: Arc<dyn Backend> = device;
    let bytes = 64 << 20;
    let address = device.reserve(Scope::Global, bytes, 512).unwrap();
    let data: Vec<u8> = (0..bytes).map(|v| (v % 251) as u8).collect();
    // SAFETY: the range is ours and nobody else touches it.
    unsafe { device.write_from_host(address, &data).unwrap() };
    let free_before = device.free_bytes(Scope::Global);
    // SAFETY: a whole reservation that nothing accesses until restored.
    let offloaded = unsafe { offload(&device, Scope::Global, address, bytes, &pinned) }.unwrap();
    assert!(device.free_bytes(Scope::Global) >= free_before + bytes - (2 << 20));
    offloaded.restore().map_err(|(error, _)| error).unwrap();
    let mut read = vec![0u8; bytes as usize];
    // SAFETY: restored at the same address.
    unsafe { device.read_to_host(address, &mut read).unwrap() };
    assert!(read == data, "the contents came back changed");
    // SAFETY: our reservation, no longer used.
    unsafe { device.release(Scope::Global, address, bytes, 512) };
}
