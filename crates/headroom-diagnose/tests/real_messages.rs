//! The classification table checked against messages people really got, each with where it was
//! reported. Non-memory failures are here too: they must never be reported as memory.

use headroom_diagnose::{classify, ExitInfo, Kind};

struct Case {
    source: &'static str,
    output: &'static str,
    expected: Option<Kind>,
}

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

const CASES: &[Case] = &[
    // ---- PyTorch CUDA OOM, oldest to newest wording.
    Case {
        source: "github.com/rowanz/neural-motifs/issues/58 (PyTorch 0.3/0.4)",
        output: "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCTensorRandom.cu:25",
        expected: Some(Kind::CudaOutOfMemory),
    },
    Case {
        source: "github.com/pytorch/pytorch/issues/16417 (PyTorch 1.0, `cached`)",
        output: "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; 8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)",
        expected: Some(Kind::CudaOutOfMemory),
    },
    Case {
        source: "github.com/pytorch/pytorch/issues/59778 (PyTorch 1.8, `reserved in total`)",
        output: "CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB already allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch)",
        expected: Some(Kind::CudaOutOfMemory),
    },
    Case {
        source: "github.com/YingqianWang/iPASSR/issues/9 (PyTorch 1.13/2.0, torch.cuda.OutOfMemoryError)",
        output: "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.73 GiB (GPU 0; 8.00 GiB total capacity; 17.20 GiB already allocated; 0 bytes free; 19.15 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        expected: Some(Kind::CudaOutOfMemory),
    },
    Case {
        source: "github.com/carolchenyx/MGFN./issues/35 (PyTorch 2.1, `capacty` typo)",
        output: "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of 6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        expected: Some(Kind::CudaOutOfMemory),
    },
    Case {
        source: "github.com/pytorch/pytorch/issues/16417#comment-2024-03-13 (PyTorch 2.2+, torch.OutOfMemoryError)",
        output: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        expected: Some(Kind::CudaOutOfMemory),
    },
    Case {
        source: "github.com/FireRedTeam/FireRedTTS2/issues/17 (other processes listed)",
        output: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 26.00 MiB. GPU 0 has a total capacity of 11.66 GiB of which 9.81 MiB is free. Process 3893521 has 618.00 MiB memory in use. Process 1493972 has 1.28 GiB memory in use. Including non-PyTorch memory, this process has 9.74 GiB memory in use. Of the allocated memory 9.30 GiB is allocated by PyTorch, and 163.19 MiB is reserved by PyTorch but unallocated.",
        expected: Some(Kind::CudaOutOfMemory),
    },
    Case {
        source: "github.com/nunchux-ai/nunchaku/issues/144 (CUDA runtime error form)",
        output: "RuntimeError: CUDA error: out of memory",
        expected: Some(Kind::CudaOutOfMemory),
    },
    Case {
        source: "github.com/google-deepmind/alphafold/issues/197 (XLA CUDA driver)",
        output: "2021-10-15 15:01:44.577626: E external/org_tensorflow/tensorflow/stream_executor/cuda/cuda_driver.cc:764] failed to alloc 2740606464 bytes unified memory; result: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        expected: Some(Kind::CudaOutOfMemory),
    },
    // ---- HIP / ROCm.
    Case {
        source: "github.com/ROCm/TheRock/issues/1054",
        output: "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 15.24 GiB of which 15.09 GiB is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        expected: Some(Kind::HipOutOfMemory),
    },
    Case {
        source: "github.com/keras-team/keras/issues/13889 (TensorFlow ROCm)",
        output: "2023-11-01 16:19:17.812101: E tensorflow/compiler/xla/stream_executor/rocm/rocm_driver.cc:606] failed to allocate 127.99TiB (140729850295296 bytes) from device: HIP_ERROR_OutOfMemory",
        expected: Some(Kind::HipOutOfMemory),
    },
    Case {
        source: "github.com/ROCm/hip/issues/2132",
        output: "error: 'hipErrorOutOfMemory'(2) at square.cpp:76",
        expected: Some(Kind::HipOutOfMemory),
    },
    // ---- TensorFlow / XLA / JAX.
    Case {
        source: "github.com/google-deepmind/alphafold/issues/1023 (JAX)",
        output: "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7406166528 bytes.",
        expected: Some(Kind::XlaResourceExhausted),
    },
    Case {
        source: "github.com/onpix/LLNeRF/issues/9 (JAX, `allocating`)",
        output: "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 20029400304 bytes.",
        expected: Some(Kind::XlaResourceExhausted),
    },
    Case {
        source: "github.com/pytorch/xla/issues/9524 (torch-xla TPU compile)",
        output: "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem.",
        expected: Some(Kind::XlaResourceExhausted),
    },
    Case {
        source: "github.com/tensorflow/tensorflow/issues/45238 (TensorFlow 2.4)",
        output: "2020-11-28 09:40:14.792808: W tensorflow/core/framework/op_kernel.cc:1763] OP_REQUIRES failed at image_resizer_state.h:142 : Resource exhausted: OOM when allocating tensor with shape[1,416,416,3] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
        expected: Some(Kind::XlaResourceExhausted),
    },
    Case {
        source: "github.com/faustomorales/keras-ocr/issues/195",
        output: "ResourceExhaustedError: failed to allocate memory [Op:AddV2]",
        expected: Some(Kind::XlaResourceExhausted),
    },
    // ---- AWS Neuron.
    Case {
        source: "github.com/vllm-project/vllm/issues/12443 (transformers-neuronx)",
        output: "RuntimeError: nrt_tensor_allocate status=4 message=\"Allocation Failure\"",
        expected: Some(Kind::NeuronAllocFailed),
    },
    Case {
        source: "github.com/aws-neuron/aws-neuron-sdk/issues/302 (Neuron runtime, inf1)",
        output: "[TDRV:dmem_alloc] Failed to alloc DEVICE memory: 4194304\n[TDRV:copy_and_stage_mr_one_channel] Failed to allocate aligned (0) buffer in MLA DRAM for W145-b of size 4194304 bytes, channel 0",
        expected: Some(Kind::NeuronAllocFailed),
    },
    Case {
        source: "github.com/aws-neuron/aws-neuron-sdk/issues/178",
        output: "[TDRV:dma_mp_allocate_dma_buffer_from_tdram] Could not satisfy request for 2097152 bytes from channel\n[TDRV:dma_mp_create_mla_buf] TDRAM 0/0 has no free space",
        expected: Some(Kind::NeuronAllocFailed),
    },
    Case {
        source: "issue 3 of this project (the torch-xla/Neuron AllocBuffer form it names)",
        output: "RuntimeError: Bad StatusOr access: AllocBuffer failed: RESOURCE_EXHAUSTED on nd0 nc0",
        expected: Some(Kind::NeuronAllocFailed),
    },
    // ---- Compilers and linkers.
    Case {
        source: "github.com/hoytech/strfry/issues/41",
        output: "g++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.\nmake: *** [golpe/rules.mk:28: build/config.o] Error 1",
        expected: Some(Kind::CompilerKilled),
    },
    Case {
        source: "github.com/otland/forgottenserver/issues/3317 (Portuguese locale, LTO)",
        output: "c++: fatal error: Morto signal terminated program lto1\ncompilation terminated.\nlto-wrapper: fatal error: /usr/bin/c++ returned 1 exit status",
        expected: Some(Kind::CompilerKilled),
    },
    Case {
        source: "github.com/wulabing/V2Ray_ws-tls_bash_onekey/issues/6 (Chinese locale, cc1)",
        output: "gcc: 致命错误：已杀死 signal terminated program cc1\n编译中断。",
        expected: Some(Kind::CompilerKilled),
    },
    Case {
        source: "github.com/kronihias/ambix/issues/18",
        output: "c++: internal compiler error: Killed (program cc1plus)\nPlease submit a full bug report,",
        expected: Some(Kind::CompilerKilled),
    },
    Case {
        source: "github.com/llvm/llvm-project/issues/65276",
        output: "collect2: fatal error: ld terminated with signal 9 [Killed]\ncompilation terminated.\n[542/1806] Linking CXX executable bin/llvm-lto\nninja: build stopped: subcommand failed.",
        expected: Some(Kind::CompilerKilled),
    },
    Case {
        source: "github.com/microsoft/onnxruntime/issues/18579",
        output: "nvcc error   : 'cicc' died due to signal 9 (Kill signal)",
        expected: Some(Kind::CompilerKilled),
    },
    Case {
        source: "github.com/NVlabs/curobo/issues/109",
        output: "31.55 nvcc error   : 'cudafe++' died due to signal 9 (Kill signal)\n31.58 make[2]: *** [CMakeFiles/nvblox_lib.dir/build.make:366: CMakeFiles/nvblox_lib.dir/src/integrators/tsdf_decay_integrator.cu.o] Error 9",
        expected: Some(Kind::CompilerKilled),
    },
    Case {
        source: "github.com/Project-OSRM/osrm-backend/issues/1170",
        output: "[ 21%] Building CXX object CMakeFiles/OSRM.dir/Library/OSRM_impl.cpp.o\nvirtual memory exhausted: Cannot allocate memory\nmake[2]: *** [CMakeFiles/OSRM.dir/Library/OSRM_impl.cpp.o] Error 1",
        expected: Some(Kind::VirtualMemoryExhausted),
    },
    // ---- Language runtimes.
    Case {
        source: "github.com/baaivision/Painter/issues/35",
        output: "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\nAborted (core dumped)",
        expected: Some(Kind::BadAlloc),
    },
    Case {
        source: "github.com/ru1ven/KeypointFusion/issues/3 (NumPy)",
        output: "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 58.0 GiB for an array with shape (176351, 176460) and data type uint16",
        expected: Some(Kind::PythonMemoryError),
    },
    Case {
        source: "github.com/numpy/numpy/issues/17595",
        output: "    MemoryError: Unable to allocate 201. GiB for an array with shape (2999, 2999, 2999) and data type int64",
        expected: Some(Kind::PythonMemoryError),
    },
    Case {
        source: "github.com/opensearch-project/OpenSearch/issues/7746 (Gradle)",
        output: "Could not read standard output of command '/usr/lib/jvm/temurin-17-jdk-amd64/bin/java'.\njava.lang.OutOfMemoryError: Java heap space\n\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)",
        expected: Some(Kind::JavaOutOfMemory),
    },
    Case {
        source: "github.com/Calsign/APDE/issues/78 (R8 in Gradle)",
        output: "Caused by: java.lang.OutOfMemoryError: GC overhead limit exceeded",
        expected: Some(Kind::JavaOutOfMemory),
    },
    Case {
        source: "github.com/Hexeption/MCP-Reborn/issues/391 (Gradle's own wording)",
        output: "* What went wrong:\nOut of memory. Java heap space",
        expected: Some(Kind::JavaOutOfMemory),
    },
    // ---- Not memory: must never be reported as memory.
    Case {
        source: "github.com/grpc/grpc.io/issues/1254 (gRPC message size)",
        output: "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:\n        status = StatusCode.RESOURCE_EXHAUSTED\n        details = \"Received message larger than max (17777780 vs. 4194304)\"",
        expected: None,
    },
    Case {
        source: "github.com/rpcpool/yellowstone-grpc/issues/421",
        output: "Error: 8 RESOURCE_EXHAUSTED: Received message larger than max (2065853043 vs 67108864)",
        expected: Some(Kind::RpcLimit),
    },
    Case {
        source: "github.com/aws-neuron/aws-neuron-sdk/issues/1118 (compiler internal error that mentions memory)",
        output: "2025-02-24T00:04:00Z USER 5521 [neuronxcc.driver.CommandDriver]: [NLA001]  Unhandled exception with message: Allocated memory out of bound {maximum.11_VN_0_ReloadStore6898_ShrinkedCopy_partial}@SB<0,185856>(756257x10376)",
        expected: None,
    },
    Case {
        source: "PyTorch CUDA kernel fault, e.g. github.com/pytorch/pytorch/issues (illegal memory access)",
        output: "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported at some other API call",
        expected: Some(Kind::GpuFault),
    },
    Case {
        source: "PyTorch index error on GPU (device-side assert)",
        output: "RuntimeError: CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        expected: Some(Kind::GpuFault),
    },
    Case {
        source: "Python disk full",
        output: "OSError: [Errno 28] No space left on device: '/tmp/torch_extensions'",
        expected: Some(Kind::DiskFull),
    },
    Case {
        source: "g++ compile error",
        output: "main.cpp:3:5: error: 'foo' was not declared in this scope\nmake: *** [Makefile:2: all] Error 1",
        expected: None,
    },
    Case {
        source: "missing CUDA headers in an extension build",
        output: "fatal error: cuda_runtime.h: No such file or directory\ncompilation terminated.",
        expected: None,
    },
    Case {
        source: "Python import failure",
        output: "ModuleNotFoundError: No module named 'torch'",
        expected: None,
    },
    Case {
        source: "TensorFlow BFC allocator warning, which says itself that it is not a failure, followed by a shape error",
        output: "W tensorflow/core/common_runtime/bfc_allocator.cc:275] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.20GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.\nValueError: Shapes (None, 10) and (None, 1) are incompatible",
        expected: None,
    },
    Case {
        source: "segfault in a native extension",
        output: "Fatal Python error: Segmentation fault\nSegmentation fault (core dumped)",
        expected: None,
    },
];

#[test]
fn table_has_enough_real_messages() {
    assert!(CASES.len() >= 30, "only {} messages", CASES.len());
    assert!(
        CASES
            .iter()
            .filter(|c| c.expected.is_none_or(|k| !k.is_memory()))
            .count()
            >= 8
    );
}

#[test]
fn every_real_message_is_classified_as_expected() {
    let mut failures = Vec::new();
    for case in CASES {
        let got = classify(case.output.as_bytes(), &ExitInfo::exited(1));
        let got_kind = got.as_ref().map(|d| d.kind);
        if got_kind != case.expected {
            failures.push(format!(
                "{}: expected {:?}, got {:?} (rule {:?})",
                case.source,
                case.expected,
                got_kind,
                got.map(|d| d.rule)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "misclassified:\n{}",
        failures.join("\n")
    );
}

#[test]
fn non_memory_failures_never_count_as_memory() {
    for case in CASES
        .iter()
        .filter(|c| c.expected.is_none_or(|k| !k.is_memory()))
    {
        let got = classify(case.output.as_bytes(), &ExitInfo::exited(1));
        assert!(
            !got.as_ref().is_some_and(|d| d.is_memory()),
            "{} reported as memory: {got:?}",
            case.source
        );
    }
}

fn approx(value: Option<u64>, expected: f64) -> bool {
    value.is_some_and(|v| (v as f64 - expected).abs() <= expected * 1e-3 + 1.0)
}

fn numbers_of(output: &str) -> headroom_diagnose::OomNumbers {
    classify(output.as_bytes(), &ExitInfo::exited(1))
        .expect("classified")
        .numbers
}

#[test]
fn pytorch_1_0_cached_form_numbers() {
    let n = numbers_of(CASES[1].output);
    assert!(approx(n.requested, 12.5 * MIB));
    assert!(approx(n.capacity, 10.92 * GIB));
    assert!(approx(n.allocated, 8.57 * MIB));
    assert!(approx(n.free, 9.28 * GIB));
    assert!(approx(n.reserved_unallocated, 4.68 * MIB));
    assert!(approx(n.reserved, 8.57 * MIB + 4.68 * MIB));
    assert_eq!(n.device, Some(0));
}

#[test]
fn pytorch_1_x_reserved_form_numbers() {
    let n = numbers_of(CASES[3].output);
    assert!(approx(n.requested, 10.73 * GIB));
    assert!(approx(n.capacity, 8.0 * GIB));
    assert!(approx(n.allocated, 17.20 * GIB));
    assert_eq!(n.free, Some(0));
    assert!(approx(n.reserved, 19.15 * GIB));
}

#[test]
fn pytorch_2_1_typo_form_numbers() {
    let n = numbers_of(CASES[4].output);
    assert!(approx(n.requested, 1.70 * GIB));
    assert!(approx(n.capacity, 6.0 * GIB));
    assert_eq!(n.free, Some(0));
    assert!(approx(n.allocated, 2.93 * GIB));
    assert!(approx(n.reserved_unallocated, 2.30 * GIB));
}

#[test]
fn pytorch_2_x_form_numbers_with_other_processes() {
    let n = numbers_of(CASES[6].output);
    assert!(approx(n.requested, 26.0 * MIB));
    assert!(approx(n.capacity, 11.66 * GIB));
    assert!(approx(n.free, 9.81 * MIB));
    assert!(approx(n.process_in_use, 9.74 * GIB));
    assert!(approx(n.allocated, 9.30 * GIB));
}

#[test]
fn xla_and_numpy_numbers() {
    assert_eq!(numbers_of(CASES[12].output).requested, Some(7_406_166_528));
    assert_eq!(numbers_of(CASES[13].output).requested, Some(20_029_400_304));
    assert!(approx(numbers_of(CASES[30].output).requested, 58.0 * GIB));
    assert!(approx(numbers_of(CASES[31].output).requested, 201.0 * GIB));
}
