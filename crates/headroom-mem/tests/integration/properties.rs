//! Property tests over random allocate/free/alias/workspace sequences on a small simulated
//! device: live blocks never overlap, every block lies inside a backend reservation, the
//! statistics agree with the block tables, bytes written to a buffer stay intact, and
//! everything goes back to the device after drop.

use std::sync::Arc;

use headroom_mem::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        bytes: u64,
        scope: Scope,
        align_shift: u32,
    },
    Free {
        index: usize,
    },
    Alias {
        index: usize,
        fraction: u8,
    },
    Workspace {
        capacity: u64,
        stages: Vec<Vec<u64>>,
    },
    EmptyCache,
}

fn scope() -> impl Strategy<Value = Scope> {
    prop_oneof![6 => Just(Scope::Global), 1 => Just(Scope::Shared), 1 => Just(Scope::Local)]
}

fn op() -> impl Strategy<Value = Op> {
    let sizes = prop_oneof![
        4 => 0u64..4096,
        3 => 4096u64..(1 << 20),
        2 => (1u64 << 20)..(12 << 20),
        1 => (12u64 << 20)..(40 << 20),
    ];
    prop_oneof![
        6 => (sizes, scope(), 0u32..5).prop_map(|(bytes, scope, align_shift)| Op::Alloc { bytes, scope, align_shift }),
        4 => any::<usize>().prop_map(|index| Op::Free { index }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(index, fraction)| Op::Alias { index, fraction }),
        1 => (1u64..(4 << 20), prop::collection::vec(prop::collection::vec(1u64..(1 << 20), 0..4), 1..4))
            .prop_map(|(capacity, stages)| Op::Workspace { capacity, stages }),
        1 => Just(Op::EmptyCache),
    ]
}

fn configs() -> impl Strategy<Value = PoolConfig> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::option::of(16u64..80),
        any::<bool>(),
    )
        .prop_map(
            |(caching, reclaim_on_miss, max_size_mib, split_limit)| PoolConfig {
                caching,
                reclaim_on_miss,
                max_size: max_size_mib.map(|mib| mib << 20),
                max_split_size: split_limit.then_some(8 << 20),
                ..PoolConfig::default()
            },
        )
}

/// A byte pattern unique to a buffer, written at allocation and checked until it is freed.
fn pattern(id: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (id as usize * 31 + i * 7) as u8).collect()
}

const PATTERN_BYTES: u64 = 64;

fn check_live(
    device: &SimulatedDevice,
    pool: &MemoryPool,
    live: &[(u64, Buffer<'_>)],
) -> Result<(), TestCaseError> {
    pool.check_invariants().map_err(TestCaseError::fail)?;
    for scope in Scope::ALL {
        let mut ranges: Vec<(u64, u64)> = live
            .iter()
            .filter(|(_, buffer)| buffer.scope() == scope)
            .map(|(_, buffer)| (buffer.address(), buffer.size_bytes().max(1)))
            .collect();
        ranges.sort();
        for pair in ranges.windows(2) {
            prop_assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap {:x?}", pair);
        }
        for &(address, bytes) in &ranges {
            prop_assert!(
                device.contains(scope, address, bytes),
                "{address:#x}+{bytes} outside the device's reservations"
            );
        }
        let requested: u64 = live
            .iter()
            .filter(|(_, b)| b.scope() == scope)
            .map(|(_, b)| b.size_bytes())
            .sum();
        prop_assert_eq!(
            pool.memory_stats_for(scope).requested_bytes.all.current,
            requested
        );
        prop_assert!(pool.reserved_bytes(scope) <= device.capacity(scope).unwrap_or(0));
    }
    for (id, buffer) in live {
        let len = buffer.size_bytes().min(PATTERN_BYTES) as usize;
        let head = buffer
            .alias([len], DType::U8, 0)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut read = vec![0u8; len];
        copy_to_host(&head, &mut read).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(read, pattern(*id, len), "buffer {} was overwritten", id);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_the_pool_consistent(config in configs(), ops in prop::collection::vec(op(), 1..60)) {
        let device = Arc::new(SimulatedDevice::new(TierCapacities { global: 96 << 20, shared: 256 << 10, local: 64 << 10 }));
        let split_limited = config.max_split_size.is_some();
        {
            let pool = MemoryPool::with_config(device.clone(), config).unwrap();
            let mut live: Vec<(u64, Buffer<'_>)> = Vec::new();
            let mut next_id = 0u64;
            for op in ops {
                match op {
                    Op::Alloc { bytes, scope, align_shift } => {
                        let alignment = Alignment::new(512 << (align_shift * 2)).unwrap();
                        match pool.alloc_buffer([bytes as usize], DType::U8, scope, alignment) {
                            Ok(mut buffer) => {
                                prop_assert!(is_aligned(&buffer, alignment));
                                next_id += 1;
                                let len = bytes.min(PATTERN_BYTES) as usize;
                                let mut head = buffer.alias_mut([len], DType::U8, 0).unwrap();
                                copy_from_host(&mut head, &pattern(next_id, len)).unwrap();
                                live.push((next_id, buffer));
                            }
                            Err(AllocError::OutOfMemory(oom)) => {
                                prop_assert_eq!(oom.requested, bytes);
                                // Refusing while a cached block fits would be a bug; only
                                // oversize blocks (max_split_size) may be held back.
                                prop_assert!(oom.largest_free_block < oom.rounded || split_limited,
                                    "refused {bytes} with a fitting cached block: {oom:?}");
                                prop_assert!(oom.allocated <= oom.reserved);
                            }
                            Err(other) => prop_assert!(false, "unexpected error {other}"),
                        }
                    }
                    Op::Free { index } if !live.is_empty() => {
                        let (_, buffer) = live.swap_remove(index % live.len());
                        buffer.free();
                    }
                    Op::Free { .. } => {}
                    Op::Alias { index, fraction } if !live.is_empty() => {
                        let (_, buffer) = &live[index % live.len()];
                        let bytes = buffer.size_bytes();
                        let fitting = bytes * u64::from(fraction) / 255;
                        let view = buffer_alias(buffer, [fitting as usize]).unwrap();
                        prop_assert_eq!(address_of(&view), buffer.address());
                        prop_assert!(buffer_alias(buffer, [bytes as usize + 1]).is_err());
                    }
                    Op::Alias { .. } => {}
                    Op::Workspace { capacity, stages } => {
                        let Ok(mut workspace) = Workspace::new(&pool, Scope::Global, capacity) else { continue };
                        let device_allocations = pool.memory_stats().num_device_alloc;
                        for (index, sizes) in stages.iter().enumerate() {
                            let stage = workspace.stage(&format!("stage{index}"));
                            let mut ends = Vec::new();
                            for &size in sizes {
                                if let Ok(view) = stage.alloc([size as usize], DType::U8, Alignment::DEFAULT) {
                                    prop_assert!(address_of(&view) >= ends.last().copied().unwrap_or(0));
                                    ends.push(address_of(&view) + size);
                                }
                            }
                            prop_assert!(stage.used() <= capacity);
                        }
                        prop_assert_eq!(pool.memory_stats().num_device_alloc, device_allocations);
                    }
                    Op::EmptyCache => pool.empty_cache(),
                }
                check_live(&device, &pool, &live)?;
            }
            drop(live);
            for scope in Scope::ALL {
                let stats = pool.memory_stats_for(scope);
                prop_assert_eq!(stats.allocated_bytes.all.current, 0);
                prop_assert_eq!(stats.requested_bytes.all.current, 0);
                prop_assert_eq!(stats.allocated_bytes.all.allocated, stats.allocated_bytes.all.freed);
            }
            pool.empty_cache();
            for scope in Scope::ALL {
                prop_assert_eq!(pool.reserved_bytes(scope), 0);
            }
        }
        for scope in Scope::ALL {
            prop_assert!(device.reservations(scope).is_empty());
            prop_assert_eq!(device.free_bytes(scope), device.capacity(scope).unwrap());
        }
    }
}
