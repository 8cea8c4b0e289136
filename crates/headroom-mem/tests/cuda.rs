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
            eprintln!("skipping: no usable CUDA device ({error})");
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
