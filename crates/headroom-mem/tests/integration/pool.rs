//! Behaviour of pools, buffers, aliases, workspaces and copies on real backends (host
//! memory and the simulated device), including out-of-memory and fragmentation.

use std::sync::Arc;

use headroom_mem::*;

const MIB: u64 = 1 << 20;

fn device(global: u64) -> Arc<SimulatedDevice> {
    Arc::new(SimulatedDevice::new(TierCapacities {
        global,
        shared: 64 << 10,
        local: 4 << 10,
    }))
}

#[test]
fn out_of_memory_is_typed_counted_and_explained() {
    let pool = MemoryPool::new(device(64 * MIB));
    let big = pool
        .alloc_buffer(
            [40 * MIB as usize],
            DType::U8,
            Scope::Global,
            Alignment::DEFAULT,
        )
        .unwrap();
    let error = pool
        .alloc_buffer(
            [40 * MIB as usize],
            DType::U8,
            Scope::Global,
            Alignment::DEFAULT,
        )
        .unwrap_err();
    let oom = error.out_of_memory().expect("an out-of-memory error");
    assert_eq!(oom.requested, 40 * MIB);
    assert_eq!(oom.allocated, 40 * MIB);
    assert_eq!(oom.reserved, 40 * MIB);
    assert_eq!(oom.device_free, 24 * MIB);
    assert_eq!(oom.device_capacity, Some(64 * MIB));
    let message = error.to_string();
    assert!(message.contains("tried to allocate 40.0 MiB"), "{message}");
    assert!(
        message.contains("24.0 MiB unreserved of 64.0 MiB"),
        "{message}"
    );
    let stats = pool.memory_stats();
    assert_eq!(stats.num_ooms, 1);
    assert_eq!(stats.num_alloc_retries, 1);
    drop(big);
}

#[test]
fn recovery_releases_the_cache_then_falls_back_to_a_smaller_shape() {
    // PyTorch's settings keep free segments cached until an allocation fails.
    let pool = MemoryPool::with_config(device(64 * MIB), PoolConfig::pytorch()).unwrap();
    // Fill the cache with a freed 40 MiB segment: the retry must release it to fit 50 MiB.
    drop(
        pool.alloc_buffer(
            [40 * MIB as usize],
            DType::U8,
            Scope::Global,
            Alignment::DEFAULT,
        )
        .unwrap(),
    );
    let fits = pool
        .alloc_buffer(
            [50 * MIB as usize],
            DType::U8,
            Scope::Global,
            Alignment::DEFAULT,
        )
        .unwrap();
    assert_eq!(pool.memory_stats().num_alloc_retries, 1);
    assert_eq!(pool.memory_stats().num_ooms, 0);
    // 50 MiB live: a 32 MiB batch cannot fit, the 8 MiB fallback can.
    let batches = [[32 * MIB as usize], [16 * MIB as usize], [8 * MIB as usize]];
    let fallback = pool
        .alloc_buffer_with_fallback(batches, DType::U8, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    assert_eq!(fallback.shape().dims(), &[8 * MIB as usize]);
    assert_eq!(pool.memory_stats().num_ooms, 2);
    drop((fits, fallback));
    assert!(matches!(
        pool.alloc_buffer_with_fallback(
            Vec::<Shape>::new(),
            DType::U8,
            Scope::Global,
            Alignment::DEFAULT
        ),
        Err(AllocError::NoShapes)
    ));
}

#[test]
fn scattered_cache_is_reported_as_fragmentation() {
    let config = PoolConfig {
        max_split_size: None,
        reclaim_on_miss: false,
        ..PoolConfig::default()
    };
    let pool = MemoryPool::with_config(device(64 * MIB), config).unwrap();
    // One 60 MiB segment, carved into 6 MiB pieces; free every other one.
    let whole = pool
        .allocate_bytes(60 * MIB, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    drop(whole);
    let pieces: Vec<_> = (0..10)
        .map(|_| {
            pool.allocate_bytes(6 * MIB, Scope::Global, Alignment::DEFAULT)
                .unwrap()
        })
        .collect();
    let kept: Vec<_> = pieces
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .collect();
    assert!(
        pool.fragmentation(Scope::Global) > 0.7,
        "{}",
        pool.fragmentation(Scope::Global)
    );
    assert_eq!(
        pool.memory_stats().inactive_split_bytes.all.current,
        30 * MIB
    );
    let error = pool
        .allocate_bytes(12 * MIB, Scope::Global, Alignment::DEFAULT)
        .unwrap_err();
    let oom = error.out_of_memory().unwrap();
    assert_eq!(
        (oom.cached_free(), oom.largest_free_block),
        (30 * MIB, 6 * MIB)
    );
    assert!(error.to_string().contains("fragmented"), "{error}");
    drop(kept);
    assert_eq!(pool.fragmentation(Scope::Global), 0.0);
    pool.check_invariants().unwrap();
}

#[test]
fn max_size_caps_reserved_bytes() {
    let config = PoolConfig {
        max_size: Some(30 * MIB),
        ..PoolConfig::default()
    };
    let pool = MemoryPool::with_config(Arc::new(HostMemory::new()), config).unwrap();
    let first = pool
        .allocate_bytes(20 * MIB, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let error = pool
        .allocate_bytes(20 * MIB, Scope::Global, Alignment::DEFAULT)
        .unwrap_err();
    assert!(
        error.to_string().contains("PoolConfig::max_size"),
        "{error}"
    );
    drop(first);
    let again = pool
        .allocate_bytes(20 * MIB, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    drop(again);
    assert!(pool.memory_stats().reserved_bytes.all.peak <= 30 * MIB);
}

#[test]
fn a_small_request_at_the_limit_takes_a_free_large_block() {
    let config = PoolConfig {
        max_size: Some(20 * MIB),
        ..PoolConfig::default()
    };
    let pool = MemoryPool::with_config(Arc::new(HostMemory::new()), config).unwrap();
    // One medium segment of 20 MiB: the whole limit, 18 MiB of it free.
    let large = pool
        .allocate_bytes(2 * MIB, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    // A new 2 MiB small segment would pass the limit; the free large block serves instead.
    let small = pool
        .allocate_bytes(100 << 10, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    assert_eq!(pool.memory_stats().reserved_bytes.all.current, 20 * MIB);
    drop(small);
    drop(large);
}

#[test]
fn invalid_configs_name_the_setting() {
    let bad = PoolConfig {
        block_size: 500,
        ..PoolConfig::default()
    };
    let error = MemoryPool::with_config(Arc::new(HostMemory::new()), bad).unwrap_err();
    assert!(error.to_string().contains("block_size = 500"), "{error}");
}

#[test]
fn stats_use_pytorch_keys_per_scope_with_reset_peak() {
    let pool = MemoryPool::new(device(64 * MIB));
    let small = pool
        .alloc_buffer([100], DType::F32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let large = pool
        .alloc_buffer(
            [3 * MIB as usize],
            DType::U8,
            Scope::Global,
            Alignment::DEFAULT,
        )
        .unwrap();
    let shared = pool
        .alloc_buffer([1024], DType::F16, Scope::Shared, Alignment::DEFAULT)
        .unwrap();
    let stats = pool.memory_stats().to_map();
    assert_eq!(stats["requested_bytes.all.current"], 400 + 3 * MIB);
    assert_eq!(stats["allocated_bytes.small_pool.current"], 512);
    assert_eq!(stats["allocated_bytes.large_pool.current"], 3 * MIB);
    assert_eq!(stats["reserved_bytes.small_pool.current"], 2 * MIB);
    assert_eq!(stats["reserved_bytes.large_pool.current"], 20 * MIB);
    assert_eq!(
        stats["active_bytes.all.current"],
        stats["allocated_bytes.all.current"]
    );
    assert_eq!(stats["allocation.all.current"], 2);
    let shared_stats = pool.memory_stats_for(Scope::Shared);
    assert_eq!(shared_stats.requested_bytes.all.current, 2048);
    drop(large);
    let stats = pool.memory_stats();
    assert_eq!(stats.allocated_bytes.all.peak, 512 + 3 * MIB);
    assert_eq!(stats.allocated_bytes.all.freed, 3 * MIB);
    pool.reset_peak();
    assert_eq!(pool.memory_stats().allocated_bytes.all.peak, 512);
    assert_eq!(
        pool.memory_stats_for(Scope::Shared)
            .requested_bytes
            .all
            .peak,
        2048
    );
    drop((small, shared));
    pool.empty_cache();
    let stats = pool.memory_stats();
    assert_eq!(stats.reserved_bytes.all.current, 0);
    assert_eq!(stats.num_device_alloc, stats.num_device_free);
}

#[test]
fn tiers_have_their_own_capacity() {
    let pool = MemoryPool::new(device(64 * MIB));
    let shared = pool
        .alloc_buffer([8192], DType::F32, Scope::Shared, Alignment::DEFAULT)
        .unwrap();
    let error = pool
        .alloc_buffer([16384], DType::F32, Scope::Shared, Alignment::DEFAULT)
        .unwrap_err();
    assert_eq!(
        error.out_of_memory().map(|oom| oom.scope),
        Some(Scope::Shared)
    );
    assert!(error.to_string().contains("shared tier"), "{error}");
    drop(shared);
}

#[test]
fn alignment_is_guaranteed() {
    let pool = MemoryPool::new(Arc::new(HostMemory::new()));
    for bytes in [1u64, 4096, 64 << 10] {
        let alignment = Alignment::new(bytes.max(2048) * 2).unwrap();
        let odd = pool
            .alloc_buffer([3], DType::U8, Scope::Global, Alignment::DEFAULT)
            .unwrap();
        let aligned = pool
            .alloc_buffer([bytes as usize], DType::U8, Scope::Global, alignment)
            .unwrap();
        assert!(
            is_aligned(&aligned, alignment),
            "{:#x}",
            address_of(&aligned)
        );
        assert!(is_aligned(&odd, Alignment::DEFAULT));
        assert_eq!(aligned.alignment(), alignment);
        drop((odd, aligned));
    }
    assert!(Alignment::new(3000).is_none());
}

#[test]
fn aliases_are_bounds_checked_views_of_the_same_bytes() {
    let pool = MemoryPool::new(device(64 * MIB));
    let mut matrix = pool
        .alloc_buffer([4, 8], DType::F32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    assert_eq!(matrix.strides(), &[8, 1]);
    let values: Vec<f32> = (0..32).map(|v| v as f32).collect();
    copy_from_host(&mut matrix, &values).unwrap();
    {
        let flat = buffer_alias(&matrix, [32]).unwrap();
        assert_eq!(address_of(&flat), address_of(&matrix));
        let mut read = vec![0f32; 32];
        copy_to_host(&flat, &mut read).unwrap();
        assert_eq!(read, values);
        let error = buffer_alias(&matrix, [33]).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("needs 132 bytes but the buffer has 128"),
            "{error}"
        );
        let row = matrix.alias([8], DType::F32, 64).unwrap();
        let mut second_half = vec![0f32; 8];
        copy_to_host(&row, &mut second_half).unwrap();
        assert_eq!(second_half[0], 16.0);
        assert!(matches!(
            matrix.alias([2], DType::F32, 2),
            Err(AliasError::Misaligned { .. })
        ));
    }
    {
        let mut last_row = matrix.alias_mut([8], DType::F32, 96).unwrap();
        copy_from_host(&mut last_row, &[-1f32; 8]).unwrap();
    }
    let mut read = vec![0f32; 32];
    copy_to_host(&matrix, &mut read).unwrap();
    assert_eq!(&read[24..], &[-1f32; 8]);
    assert_eq!(read[23], 23.0);
    assert!(matches!(
        copy_to_host(&matrix, &mut [0i32; 32]),
        Err(CopyError::DTypeMismatch { .. })
    ));
    matrix.free();
}

#[test]
fn workspace_stages_reuse_one_allocation() {
    let pool = MemoryPool::with_config(
        device(64 * MIB),
        PoolConfig {
            record_trace: true,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let mut workspace = Workspace::new(&pool, Scope::Global, 4 * MIB).unwrap();
    let device_allocations = pool.memory_stats().num_device_alloc;
    let mut first_addresses = Vec::new();
    for stage_index in 0..5 {
        let stage = workspace.stage(&format!("stage{stage_index}"));
        let mut a = stage.alloc([1024], DType::F32, Alignment::DEFAULT).unwrap();
        let b = stage
            .alloc([100], DType::F16, Alignment::new(4096).unwrap())
            .unwrap();
        assert!(address_of(&b) >= address_of(&a) + 4096);
        assert!(is_aligned(&b, Alignment::new(4096).unwrap()));
        copy_from_host(&mut a, &[stage_index as f32; 1024]).unwrap();
        first_addresses.push(address_of(&a));
        let error = stage
            .alloc([4 * MIB as usize], DType::U8, Alignment::DEFAULT)
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains(&format!("stage `stage{stage_index}`")),
            "{error}"
        );
    }
    assert!(first_addresses.windows(2).all(|pair| pair[0] == pair[1]));
    assert_eq!(pool.memory_stats().num_device_alloc, device_allocations);
    assert_eq!(workspace.stages_run(), 5);
    assert_eq!(workspace.peak_used(), 4096 + 200);
    drop(workspace);
    assert_eq!(pool.memory_stats().allocated_bytes.all.current, 0);
}

#[test]
fn copies_move_bytes_between_host_and_devices() {
    let gpu = MemoryPool::new(device(64 * MIB));
    let other_gpu = MemoryPool::new(device(64 * MIB));
    let host = MemoryPool::new(Arc::new(HostMemory::new()));
    let data: Vec<i32> = (0..1000).collect();
    let mut on_gpu = gpu
        .alloc_buffer([1000], DType::I32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let mut same_gpu = gpu
        .alloc_buffer([10, 100], DType::I32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let mut on_other = other_gpu
        .alloc_buffer([1000], DType::I32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let mut on_host = host
        .alloc_buffer([1000], DType::I32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    copy_from_host(&mut on_gpu, &data).unwrap();
    copy(&mut same_gpu, &on_gpu).unwrap();
    copy(&mut on_other, &same_gpu).unwrap();
    copy(&mut on_host, &on_other).unwrap();
    let mut read = vec![0i32; 1000];
    copy_to_host(&on_host, &mut read).unwrap();
    assert_eq!(read, data);
    let short = gpu
        .alloc_buffer([999], DType::I32, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let error = copy(&mut on_gpu, &short).unwrap_err();
    assert_eq!(
        error,
        CopyError::LengthMismatch {
            dst: 4000,
            src: 3996
        }
    );
}

#[test]
fn async_copies_complete_before_their_scope_ends() {
    let gpu = MemoryPool::new(device(64 * MIB));
    let stream = Stream::new();
    let data: Vec<f64> = (0..4096).map(f64::from).collect();
    let mut staged = gpu
        .alloc_buffer([4096], DType::F64, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let mut copied = gpu
        .alloc_buffer([64, 64], DType::F64, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let mut read = vec![0f64; 4096];
    stream.scope(|s| {
        let upload = s.copy_from_host(&mut staged, &data).unwrap();
        upload.wait().unwrap();
        assert!(upload.query());
    });
    // A copy borrows its destination mutably until the scope ends, so reading `copied`
    // back needs the next scope: the borrow checker rules out the data race.
    stream
        .scope(|s| s.copy(&mut copied, &staged).map(|_| ()))
        .unwrap();
    stream
        .scope(|s| s.copy_to_host(&copied, &mut read).map(|_| ()))
        .unwrap();
    assert_eq!(read, data);
    stream.synchronize();
    let mut too_short = [0f64; 3];
    let error = stream.scope(|s| s.copy_to_host(&copied, &mut too_short).unwrap_err());
    // Reading out, the host slice is the destination.
    assert_eq!(
        error,
        CopyError::LengthMismatch {
            dst: 24,
            src: 32768
        }
    );
}

#[test]
fn no_cache_mode_returns_every_free_to_the_backend() {
    let sim = device(64 * MIB);
    let pool = MemoryPool::with_config(sim.clone(), PoolConfig::no_cache()).unwrap();
    let a = pool
        .allocate_bytes(1000, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    let b = pool
        .allocate_bytes(3 * MIB, Scope::Global, Alignment::DEFAULT)
        .unwrap();
    assert_eq!(sim.reservations(Scope::Global).len(), 2);
    drop(a);
    assert_eq!(sim.reservations(Scope::Global).len(), 1);
    drop(b);
    assert!(sim.reservations(Scope::Global).is_empty());
    let stats = pool.memory_stats();
    assert_eq!((stats.num_device_alloc, stats.num_device_free), (2, 2));
}

#[test]
fn dropping_the_pool_returns_every_segment() {
    let sim = device(64 * MIB);
    {
        let pool = MemoryPool::new(sim.clone());
        let kept = pool
            .allocate_bytes(5 * MIB, Scope::Global, Alignment::DEFAULT)
            .unwrap();
        drop(
            pool.allocate_bytes(100, Scope::Global, Alignment::DEFAULT)
                .unwrap(),
        );
        drop(kept);
        assert!(!sim.reservations(Scope::Global).is_empty());
    }
    assert!(sim.reservations(Scope::Global).is_empty());
    assert_eq!(sim.free_bytes(Scope::Global), 64 * MIB);
}

#[test]
fn impossible_sizes_and_alignments_are_errors_not_overflows() {
    let pool = MemoryPool::new(device(64 * MIB));
    let huge = Alignment::new(1 << 63).unwrap();
    let error = pool
        .allocate_bytes(u64::MAX - 10, Scope::Global, Alignment::DEFAULT)
        .unwrap_err();
    assert!(matches!(error, AllocError::SizeOverflow { .. }), "{error}");
    assert!(pool
        .allocate_bytes(1, Scope::Global, huge)
        .unwrap_err()
        .out_of_memory()
        .is_some());
    let shape = [usize::MAX, 4];
    assert!(matches!(
        pool.alloc_buffer(shape, DType::F64, Scope::Global, Alignment::DEFAULT),
        Err(AllocError::ShapeTooLarge { .. })
    ));
    let mut workspace = Workspace::new(&pool, Scope::Global, MIB).unwrap();
    let stage = workspace.stage("overflow");
    assert!(matches!(
        stage.alloc([1], DType::U8, huge),
        Err(WorkspaceError::Exhausted { .. })
    ));
    assert_eq!(stage.used(), 0);
}
