//! Recognising an attempt that ran out of memory, so the governor retries it alone.

use headroom_diagnose::{classify, ExitInfo};

use crate::protocol::Attempt;

/// Whether an attempt failed for lack of memory, by the shared failure rules: a SIGKILL the
/// governor did not send (the kernel's OOM killer), `Killed signal terminated program cc1plus`,
/// `virtual memory exhausted`, `std::bad_alloc`, a killed cicc or ptxas, and the rest.
pub fn ran_out_of_memory(attempt: &Attempt) -> bool {
    let exit = ExitInfo {
        code: attempt.exit_code,
        signal: attempt.signal,
        kernel_oom_evidence: None,
    };
    classify(attempt.stderr_tail.as_bytes(), &exit).is_some_and(|diagnosis| diagnosis.is_memory())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(exit_code: Option<i32>, signal: Option<i32>, stderr: &str) -> Attempt {
        Attempt {
            exit_code,
            signal,
            max_rss: 0,
            cpu_ms: 0,
            stderr_tail: stderr.into(),
            ended_at: 0,
        }
    }

    #[test]
    fn recognises_oom_kills_and_messages_but_not_errors() {
        assert!(ran_out_of_memory(&attempt(None, Some(9), "")));
        assert!(ran_out_of_memory(&attempt(
            Some(1),
            None,
            "g++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated."
        )));
        assert!(ran_out_of_memory(&attempt(
            Some(1),
            None,
            "cc1plus: out of memory allocating 65536 bytes"
        )));
        assert!(ran_out_of_memory(&attempt(
            Some(1),
            None,
            "virtual memory exhausted: Cannot allocate memory"
        )));
        assert!(!ran_out_of_memory(&attempt(
            Some(1),
            None,
            "a.cpp:3:1: error: expected ';' before '}' token"
        )));
        assert!(
            !ran_out_of_memory(&attempt(None, Some(2), "")),
            "Ctrl-C is not an OOM"
        );
        assert!(!ran_out_of_memory(&attempt(
            Some(0),
            None,
            "warning: out of memory is a phrase"
        )));
    }
}
