//! The classification table: which message means which failure, and what to do about it.
//!
//! The rules are data so that adding a newly seen message is a one-line change with a test next
//! to it (`tests/real_messages.rs` holds the real messages, each with its source). Patterns are
//! case-sensitive on purpose: tools print these messages verbatim, and prose that merely talks
//! about memory ("out of memory" in a log line) should not match.

use serde::{Deserialize, Serialize};

/// What kind of failure a rule recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The kernel's OOM killer ended the command (cgroup event or kernel log says so).
    KernelOomKill,
    /// The command died of SIGKILL and nothing else explains it: usually the OOM killer whose
    /// record could not be read.
    SigkillUnexplained,
    /// A compiler driver reports that its compiler or linker process was killed
    /// (`Killed signal terminated program cc1plus`, `ld terminated with signal 9`).
    CompilerKilled,
    /// A compiler ran out of address space (`virtual memory exhausted`, `cc1plus: out of memory`).
    VirtualMemoryExhausted,
    /// C++ `std::bad_alloc`.
    BadAlloc,
    /// A native allocation failure outside C++ (Rust's `memory allocation of N bytes failed`,
    /// `LLVM ERROR: out of memory`).
    NativeAllocFailed,
    /// Python `MemoryError` (including NumPy's `_ArrayMemoryError`).
    PythonMemoryError,
    /// PyTorch or the CUDA runtime ran out of GPU memory.
    CudaOutOfMemory,
    /// PyTorch on ROCm or the HIP runtime ran out of GPU memory.
    HipOutOfMemory,
    /// TensorFlow / XLA / JAX `RESOURCE_EXHAUSTED` out of memory.
    XlaResourceExhausted,
    /// AWS Neuron runtime could not allocate device memory (`AllocBuffer`, `nrt_tensor_allocate`).
    NeuronAllocFailed,
    /// Java `OutOfMemoryError`.
    JavaOutOfMemory,
    /// Not memory: the disk is full.
    DiskFull,
    /// Not memory: gRPC `RESOURCE_EXHAUSTED` for an oversized message or a quota.
    RpcLimit,
    /// Not memory: a GPU kernel fault (illegal address, device-side assert).
    GpuFault,
    /// Not memory: a limit on processes, threads or open files.
    ResourceLimit,
}

impl Kind {
    /// Whether this failure means the command needed more memory than it had. Fallback ladders
    /// and OOM retries move on only for these.
    pub fn is_memory(self) -> bool {
        !matches!(
            self,
            Kind::DiskFull | Kind::RpcLimit | Kind::GpuFault | Kind::ResourceLimit
        )
    }

    /// Where this kind of failure goes when a log holds several, lower first: the kernel's
    /// record of a kill, then other memory failures, then compilers reporting a killed child
    /// (usually the consequence of a kill), then failures that are not memory.
    pub fn root_rank(self) -> u8 {
        match self {
            Kind::KernelOomKill => 0,
            Kind::CompilerKilled | Kind::SigkillUnexplained => 2,
            kind if kind.is_memory() => 1,
            _ => 3,
        }
    }

    /// A short human label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::KernelOomKill => "killed by the kernel OOM killer",
            Kind::SigkillUnexplained => "killed by SIGKILL (probably the OOM killer)",
            Kind::CompilerKilled => "compiler process killed (out of memory)",
            Kind::VirtualMemoryExhausted => "compiler ran out of virtual memory",
            Kind::BadAlloc => "C++ std::bad_alloc",
            Kind::NativeAllocFailed => "native allocation failed",
            Kind::PythonMemoryError => "Python MemoryError",
            Kind::CudaOutOfMemory => "CUDA out of memory",
            Kind::HipOutOfMemory => "HIP/ROCm out of memory",
            Kind::XlaResourceExhausted => "XLA/TensorFlow RESOURCE_EXHAUSTED (out of memory)",
            Kind::NeuronAllocFailed => "Neuron device allocation failed",
            Kind::JavaOutOfMemory => "Java OutOfMemoryError",
            Kind::DiskFull => "disk full (not memory)",
            Kind::RpcLimit => "RPC size or quota limit (not memory)",
            Kind::GpuFault => "GPU kernel fault (not memory)",
            Kind::ResourceLimit => "process, thread or file limit (not memory)",
        }
    }
}

/// One row of the table.
#[derive(Debug)]
pub struct Rule {
    /// A stable name, shown in reports and used by tests.
    pub name: &'static str,
    pub kind: Kind,
    /// A `regex` crate pattern matched against the command's output.
    pub pattern: &'static str,
    pub advice: &'static str,
}

const ADVICE_HOST_BUILD: &str = "the compiler ran out of host memory: lower the build's parallelism \
(`-j`, MAX_JOBS, CMAKE_BUILD_PARALLEL_LEVEL), compile this unit with less optimisation or debug info \
(`-O1`, `-g0`), or let `headroom build` admit jobs by memory";
const ADVICE_LINKER: &str =
    "the linker ran out of memory: link fewer targets at once (ninja `-l`, a \
link pool of 1), use `-fuse-ld=lld` or `mold`, drop LTO or debug info for this link (`-g0`, \
`-Wl,--no-keep-memory`)";
const ADVICE_GPU_TORCH: &str =
    "the GPU ran out of memory: lower the batch size or sequence length, \
use mixed precision (bf16/fp16), activation checkpointing, or offload; if reserved-but-unallocated \
memory is large set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
const ADVICE_XLA: &str =
    "the accelerator ran out of memory: lower the batch size, shard the model \
over more devices (tensor/pipeline parallelism), use bf16; for JAX set \
XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_MEM_FRACTION";
const ADVICE_NEURON: &str =
    "the Neuron device ran out of memory: raise the tensor-parallel degree \
(more NeuronCores), lower the batch size or sequence length, or compile with a smaller model \
configuration; `neuron-top` shows per-core device memory";
const ADVICE_HOST_PROCESS: &str =
    "the process ran out of host memory: process the data in smaller \
pieces, lower the batch size or worker count, add swap, or run on a machine with more RAM \
(`headroom doctor` shows what this one has)";

const ADVICE_KERNEL: &str = "the kernel's OOM killer ended a process: lower the work's \
parallelism or batch size, add swap, close other memory users, or raise the memory limit; \
`headroom diagnose --kernel-log` lists recent kills and whose limit each enforced";

/// Messages that read like a failure but say themselves that they are not one: TensorFlow's
/// allocator warns `ran out of memory trying to allocate … The caller indicates that this is
/// not a failure` and goes on. A line that matched a rule is skipped when it, with the two
/// lines after it (consoles wrap this warning), says so.
pub static NOT_FAILURES: &[&str] = &[r"The caller indicates that this is not a failure"];

/// The table. Within one line the earliest row that matches wins, so rows for look-alikes come
/// before the memory rows whose words they share. Across lines, [`crate::scan`] orders the
/// failures it finds by root cause.
pub static RULES: &[Rule] = &[
    // --- The kernel's own record (dmesg, journalctl -k, syslog) and container runtimes.
    // `crate::kernel` joins a kill's lines into one.
    Rule {
        name: "kernel-oom-invoked",
        kind: Kind::KernelOomKill,
        pattern: r"\S invoked oom-killer: ",
        advice: ADVICE_KERNEL,
    },
    Rule {
        name: "kernel-oom-constraint",
        kind: Kind::KernelOomKill,
        pattern: r"oom-kill:constraint=CONSTRAINT_",
        advice: ADVICE_KERNEL,
    },
    Rule {
        name: "kernel-oom-killed",
        kind: Kind::KernelOomKill,
        pattern: r"(?:Out of memory|Memory cgroup out of memory): Kill(?:ed)? process \d+|\bKilled process \d+(?:, UID \d+,)? \(|oom_reaper: reaped process \d+",
        advice: ADVICE_KERNEL,
    },
    Rule {
        name: "container-oomkilled",
        kind: Kind::KernelOomKill,
        // `kubectl describe` (`Reason: OOMKilled`), `kubectl get pods` (a column of its own),
        // `docker inspect` (`"OOMKilled": true`; false is no kill).
        pattern: r#"(?:^|\s)OOMKilled(?:\s|$)|"OOMKilled":\s*true"#,
        advice: "the container exceeded its memory limit and the kernel killed it: raise \
`resources.limits.memory` (Kubernetes) or `--memory` (Docker) if the node has the memory, or \
make the workload use less",
    },
    // --- Look-alikes that share words with the GPU and runtime rows below.
    Rule {
        name: "grpc-limit",
        kind: Kind::RpcLimit,
        pattern: r"(?i:RESOURCE_EXHAUSTED|ResourceExhausted)[^\n]*(?:[Rr]eceived message (?:larger than max|exceeds)|[Qq]uota exceeded|message exceeds maximum size)|[Rr]eceived message larger than max \(|gRPC message exceeds maximum size|Resource has been exhausted \(e\.g\. check quota\)|Quota exceeded for quota metric|Resource exhausted\. Please try again later",
        advice: "an RPC hit a message-size or quota limit: raise the client/server max message \
size (`grpc.max_receive_message_length`) or the quota; more memory will not help",
    },
    Rule {
        name: "thread-or-process-limit",
        kind: Kind::ResourceLimit,
        pattern: r"OutOfMemoryError: unable to create (?:new )?native thread|fork: (?:retry: )?Resource temporarily unavailable|\[Errno 11\] Resource temporarily unavailable|\[Errno 24\] Too many open files",
        advice: "a limit on processes, threads or open files was hit, not a lack of memory: \
raise `ulimit -u` / `ulimit -n`, a container's `pids.max`, or start fewer workers",
    },
    Rule {
        name: "gpu-fault",
        kind: Kind::GpuFault,
        pattern: r"an illegal memory access was encountered|cudaErrorIllegalAddress|device-side assert triggered|misaligned address|unspecified launch failure|HSA_STATUS_ERROR_MEMORY_(?:APERTURE_VIOLATION|FAULT)|Memory access fault by GPU node|amdgpu: \[\w+\] page fault",
        advice: "a GPU kernel faulted: rerun with CUDA_LAUNCH_BLOCKING=1 (or AMD_SERIALIZE_KERNEL=3) \
to find the kernel; this is a bug, not a lack of memory",
    },
    // --- GPU frameworks: their messages contain generic words later rows also match.
    Rule {
        name: "torch-hip-oom",
        kind: Kind::HipOutOfMemory,
        pattern: r"HIP out of memory|HIP error: out of memory|hipErrorOutOfMemory|hipErrorMemoryAllocation|HIP_ERROR_OutOfMemory|hipError_t\(1002\)|\b[Hh][Ii][Pp]\w*[^\n]{0,80}\bout of memory",
        advice: "the AMD GPU ran out of memory: lower the batch size or sequence length, use \
mixed precision, activation checkpointing or offload; if reserved-but-unallocated memory is large set \
PYTORCH_HIP_ALLOC_CONF=expandable_segments:True",
    },
    Rule {
        name: "xla-resource-exhausted",
        kind: Kind::XlaResourceExhausted,
        pattern: r"(?i:RESOURCE_EXHAUSTED|Resource exhausted|ResourceExhaustedError):? *[^\n]*(?:[Oo]ut of memory|OOM when allocating|[Rr]an out of memory|[Ff]ailed to allocate|[Ee]rror allocating|Attempting to (?:reserve|allocate))|Attempting to reserve \S+ at the bottom of memory|Ran out of memory in memory space \w+|Allocator \(\w+\) ran out of memory trying to allocate",
        advice: ADVICE_XLA,
    },
    Rule {
        name: "tf-oom-when-allocating",
        kind: Kind::XlaResourceExhausted,
        pattern: r"OOM when allocating tensor",
        advice: ADVICE_XLA,
    },
    Rule {
        name: "torch-cuda-oom",
        kind: Kind::CudaOutOfMemory,
        pattern: r"CUDA out of memory|OutOfMemoryError: CUDA|cuda runtime error \(2\) : out of memory|error=2 : out of memory|CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|cudaMalloc[^\n]{0,80}(?:failed|error)[^\n]{0,20}out of memory|Out of memory allocating [\d,]+ bytes \(allocated so far",
        advice: ADVICE_GPU_TORCH,
    },
    Rule {
        name: "vllm-kv-cache",
        kind: Kind::CudaOutOfMemory,
        pattern: r"No available memory for the cache blocks|larger than the available KV cache memory|larger than the maximum number of tokens that can be stored in KV cache",
        advice: "the GPU has too little memory left for vLLM's KV cache: raise \
`gpu_memory_utilization`, lower `max_model_len` or `max_num_seqs`, use a quantised model, or \
spread the model over more GPUs (`tensor_parallel_size`)",
    },
    Rule {
        name: "neuron-alloc",
        kind: Kind::NeuronAllocFailed,
        pattern: r#"AllocBuffer[^\n]*(?:[Ff]ail|out of|exhaust|RESOURCE)|nrt_tensor_allocate status=4|Failed to alloc DEVICE memory|TDRAM \d+/\d+ has no free space|No more pages for ring type|status=4 message="?Allocation Failure"#,
        advice: ADVICE_NEURON,
    },
    // --- Compilers and linkers.
    Rule {
        name: "gcc-killed",
        // `Killed` is translated (`Morto`, `已杀死`), so match what follows it.
        pattern: r"signal terminated program (?:cc1plus|cc1|lto1|cc1obj|f951|as)\b",
        kind: Kind::CompilerKilled,
        advice: ADVICE_HOST_BUILD,
    },
    Rule {
        name: "gcc-ice-killed",
        kind: Kind::CompilerKilled,
        // The signal's name in the locales seen in real reports; a segfault is not a kill.
        pattern: r"(?i:internal compiler error|Internal error): (?:Killed|Processus arrêté|Morto|Matado|Ucciso|Getötet|已杀死|已終止) \(program \w+\)",
        advice: ADVICE_HOST_BUILD,
    },
    Rule {
        name: "ld-killed",
        kind: Kind::CompilerKilled,
        pattern: r"ld terminated with signal 9",
        advice: ADVICE_LINKER,
    },
    Rule {
        name: "nvcc-killed",
        kind: Kind::CompilerKilled,
        pattern: r"nvcc error\s*: '[\w+.-]+' died due to signal 9",
        advice: "nvcc's front end or device compiler ran out of host memory: lower the build's \
parallelism (MAX_JOBS, `-j`), build fewer architectures per job (TORCH_CUDA_ARCH_LIST, \
CMAKE_CUDA_ARCHITECTURES), or pass `--threads 1` to nvcc",
    },
    Rule {
        name: "nvcc-threads-killed",
        kind: Kind::CompilerKilled,
        // nvcc building several targets at once (`--threads`) reports a cicc or ptxas that
        // the OOM killer ended with the shell's bare `Killed` and exits 255
        // (bench/build/nvcc-targets.sh, nvcc 13.2 under a memory cgroup).
        pattern: r"(?m)^\s*Killed\s*$",
        advice: "a process the compiler ran was killed (SIGKILL), most likely by the OOM \
killer: lower the build's parallelism (MAX_JOBS, `-j`), or for nvcc pass `--threads 1`, which \
builds its targets one at a time",
    },
    Rule {
        name: "clang-killed",
        kind: Kind::CompilerKilled,
        pattern: r"clang(?:\+\+)?(?:-\d+)?: error: unable to execute command: Killed",
        advice: ADVICE_HOST_BUILD,
    },
    Rule {
        name: "tool-sigkilled",
        kind: Kind::CompilerKilled,
        // cargo for rustc, MSBuild for csc, neuronx-cc for its back end: a compiler that
        // died of SIGKILL, as the tool that ran it reports it.
        pattern: r"\(signal: 9, SIGKILL: kill\)|\.dll\x22? exited with code 137|Backend exited with code -9|Compile command returned: -9|neuronx-cc was forcibly killed",
        advice: ADVICE_HOST_BUILD,
    },
    Rule {
        name: "virtual-memory-exhausted",
        // MSVC's error numbers are the same in every language (`C1002: 在第 2 遍中编译器的堆空间不足`).
        kind: Kind::VirtualMemoryExhausted,
        pattern: r"virtual memory exhausted|(?:cc1(?:plus)?|lto1|f951)(?:\.exe)?: out of memory allocating|fatal error C10(?:60|02)\b|C3859: Failed to create virtual memory for PCH",
        advice: "the compiler could not get more memory or address space: check `ulimit -v`, \
add RAM, swap or page file, lower the build's parallelism, or compile this unit with `-O1 -g0`",
    },
    Rule {
        name: "llvm-oom",
        kind: Kind::NativeAllocFailed,
        pattern: r"LLVM ERROR: out of memory|memory allocation of \d+ bytes failed",
        advice: ADVICE_HOST_PROCESS,
    },
    Rule {
        name: "enomem",
        kind: Kind::NativeAllocFailed,
        // Python's OSError, fork(2) in shells and C programs.
        pattern: r"\[Errno 12\] Cannot allocate memory|fork(?: #\d+)? failed: 12 \(Cannot allocate memory\)|\bfork: Cannot allocate memory",
        advice: ADVICE_HOST_PROCESS,
    },
    Rule {
        name: "cxx-runtime-error-oom",
        kind: Kind::NativeAllocFailed,
        // A C++ library reporting its own failed allocation through an exception.
        pattern: r"what\(\):\s+[^\n]{0,80}\bout of memory",
        advice: ADVICE_HOST_PROCESS,
    },
    Rule {
        name: "go-runtime-oom",
        kind: Kind::NativeAllocFailed,
        pattern: r"(?m)^fatal error: (?:runtime: )?out of memory|runtime: out of memory: cannot allocate|runtime: VirtualAlloc of \d+ bytes failed",
        advice: ADVICE_HOST_PROCESS,
    },
    Rule {
        name: "cxx-bad-alloc",
        kind: Kind::BadAlloc,
        pattern: r"std::bad_alloc",
        advice: ADVICE_HOST_PROCESS,
    },
    // --- Language runtimes.
    Rule {
        name: "python-memory-error",
        kind: Kind::PythonMemoryError,
        // Also inside pytest's `INTERNALERROR>` and assertion (`E   `) reports.
        pattern: r"(?m)^\s*(?:INTERNALERROR>\s*|E\s+)?(?:[\w.]*\.)?_?(?:Array)?MemoryError\b",
        advice: ADVICE_HOST_PROCESS,
    },
    Rule {
        name: "java-oom",
        kind: Kind::JavaOutOfMemory,
        pattern: r"java\.lang\.OutOfMemoryError|OutOfDirectMemoryError|Out of memory\. Java heap space",
        advice: "the JVM hit its heap limit: raise `-Xmx` (for Gradle: `org.gradle.jvmargs` in \
gradle.properties; for Bazel: `--host_jvm_args=-Xmx…`) if the machine has the memory, otherwise \
reduce parallel workers",
    },
    // --- Not memory, although the words look alike. Listed so they are reported as what they are.
    Rule {
        name: "disk-full",
        kind: Kind::DiskFull,
        pattern: r"No space left on device|ENOSPC",
        advice: "a disk is full: free space in the build or temp directory (TMPDIR) or point it \
elsewhere; more memory will not help",
    },
];
