//! The build governor: daemon, wire protocol, compiler shims, job supervision and OOM retries.
