//! Recognising an attempt that ran out of memory, so the governor retries it alone.

use crate::protocol::Attempt;

/// Messages compilers and runtimes print when memory ran out.
const OUT_OF_MEMORY_MESSAGES: [&str; 7] = [
    "Killed signal terminated program",
    "virtual memory exhausted",
    "out of memory",
    "std::bad_alloc",
    "Cannot allocate memory",
    "LLVM ERROR: out of memory",
    "terminate called after throwing an instance of 'std::bad_alloc'",
];

/// Whether an attempt failed for lack of memory: killed by SIGKILL (which the governor did not
/// send: the kernel's OOM killer), or a failure whose stderr says memory ran out.
pub fn ran_out_of_memory(attempt: &Attempt) -> bool {
    if attempt.signal == Some(libc::SIGKILL) {
        return true;
    }
    attempt.exit_code != Some(0) && OUT_OF_MEMORY_MESSAGES.iter().any(|m| attempt.stderr_tail.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(exit_code: Option<i32>, signal: Option<i32>, stderr: &str) -> Attempt {
        Attempt { exit_code, signal, max_rss: 0, cpu_ms: 0, stderr_tail: stderr.into() }
    }

    #[test]
    fn recognises_oom_kills_and_messages_but_not_errors() {
        assert!(ran_out_of_memory(&attempt(None, Some(9), "")));
        assert!(ran_out_of_memory(&attempt(
            Some(1),
            None,
            "g++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated."
        )));
        assert!(ran_out_of_memory(&attempt(Some(1), None, "cc1plus: out of memory allocating 65536 bytes")));
        assert!(ran_out_of_memory(&attempt(Some(1), None, "virtual memory exhausted: Cannot allocate memory")));
        assert!(!ran_out_of_memory(&attempt(Some(1), None, "a.cpp:3:1: error: expected ';' before '}' token")));
        assert!(!ran_out_of_memory(&attempt(None, Some(2), "")), "Ctrl-C is not an OOM");
        assert!(!ran_out_of_memory(&attempt(Some(0), None, "warning: out of memory is a phrase")));
    }
}
