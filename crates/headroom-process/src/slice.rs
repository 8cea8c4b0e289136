//! A short scheduler slice for the processes a compiler call waits on: the shim, and the
//! governor's threads that answer it.
//!
//! On a host busy with other work, each time a governed call wakes a process (the shim on the
//! governor's answer, the compiler it starts, the shim again when the compiler ends) that
//! process waits for a core until the task running there has used up its slice. Linux 6.12's
//! EEVDF scheduler lets a task ask for a shorter slice (`sched_setattr`'s `sched_runtime` for
//! `SCHED_OTHER` and `SCHED_BATCH`); a waking task with a shorter slice than the running one
//! gets the core at once. Its share of the CPU stays what its niceness gives it: it runs more
//! often, for shorter turns. No privilege is needed. A kernel without per-task slices reports
//! none, and nothing is changed there.
//!
//! Children inherit the slice, which is what the compiler's start needs; the compiler then gets
//! back the slice the shim had ([`Slice::give_back`]), so a long compile runs as it would have.

use std::io;

/// The slice asked for: the shortest the kernel grants.
const SHORT_SLICE_NS: u64 = 100_000;

/// The slice a thread had before it shortened it, to give back to the processes it starts.
#[derive(Debug, Clone, Copy)]
pub struct Slice {
    original_ns: u64,
}

impl Slice {
    /// Shortens the calling thread's slice, returning the slice it had; `None` where the kernel
    /// has no per-task slices, the thread is not under the fair scheduler's normal or batch
    /// policies, or the kernel refused.
    pub fn shorten_own() -> Option<Slice> {
        let mut attr = get(0).ok()?;
        let fair = matches!(
            attr.sched_policy as i32,
            libc::SCHED_OTHER | libc::SCHED_BATCH
        );
        // A kernel without per-task slices reports 0.
        if !fair || attr.sched_runtime == 0 {
            return None;
        }
        let original_ns = attr.sched_runtime;
        attr.sched_runtime = SHORT_SLICE_NS.min(original_ns);
        set(0, &attr).ok()?;
        Some(Slice { original_ns })
    }

    /// Gives process `pid` (a child that inherited the short slice) the slice this process
    /// had, keeping its policy and niceness as they are now. Failing only costs speed.
    /// Pid 0 is the calling thread.
    pub fn give_back(self, pid: u32) {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return;
        };
        if let Ok(mut attr) = get(pid) {
            attr.sched_runtime = self.original_ns;
            let _ = set(pid, &attr);
        }
    }

    /// Runs `work` on the calling thread, which shortened its slice, with the slice it had,
    /// and shortens it again after: for long work on a thread that otherwise answers compiler
    /// calls, and for the threads that work starts, which inherit the slice.
    pub fn while_given_back<T>(self, work: impl FnOnce() -> T) -> T {
        self.give_back(0);
        let done = work();
        let _ = Slice::shorten_own();
        done
    }
}

/// The scheduling attributes of thread `tid` (0 for the calling one).
fn get(tid: libc::pid_t) -> io::Result<libc::sched_attr> {
    // SAFETY: sched_attr is plain data that all zeroes is valid for.
    let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::sched_attr>() as libc::c_uint;
    // SAFETY: the kernel writes at most `size` bytes into `attr`.
    let done = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut attr, size, 0) };
    if done == 0 {
        Ok(attr)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets thread `tid`'s scheduling attributes (0 for the calling one).
fn set(tid: libc::pid_t, attr: &libc::sched_attr) -> io::Result<()> {
    let mut attr = *attr;
    attr.size = std::mem::size_of::<libc::sched_attr>() as u32;
    // SAFETY: `attr` is a valid sched_attr of the size it says.
    let done = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &attr, 0) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice of thread `tid`, as the kernel reports it.
    fn slice_of(tid: libc::pid_t) -> u64 {
        get(tid).expect("sched_getattr").sched_runtime
    }

    #[test]
    fn a_shortened_slice_is_inherited_and_given_back_with_the_niceness_kept() {
        // On its own thread: the slice is per thread, and the test harness's threads go on.
        std::thread::spawn(|| {
            let before = slice_of(0);
            let Some(slice) = Slice::shorten_own() else {
                eprintln!("skipped: this kernel has no per-task scheduler slices (Linux 6.12)");
                return;
            };
            assert_eq!(slice_of(0), SHORT_SLICE_NS.min(before));
            let mut child = std::process::Command::new("sleep")
                .args(["5"])
                .spawn()
                .expect("sleep runs");
            let pid = child.id() as libc::pid_t;
            assert_eq!(slice_of(pid), SHORT_SLICE_NS.min(before), "inherited");
            // SAFETY: setpriority on a child of ours.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, 7) };
            slice.give_back(child.id());
            assert_eq!(slice_of(pid), before);
            assert_eq!(get(pid).unwrap().sched_nice, 7, "niceness kept");
            child.kill().unwrap();
            child.wait().unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn work_given_back_the_slice_starts_threads_with_it_and_the_short_one_returns() {
        std::thread::spawn(|| {
            let before = slice_of(0);
            let Some(slice) = Slice::shorten_own() else {
                eprintln!("skipped: this kernel has no per-task scheduler slices (Linux 6.12)");
                return;
            };
            let (own, started) = slice.while_given_back(|| {
                let started = std::thread::spawn(|| slice_of(0)).join().unwrap();
                (slice_of(0), started)
            });
            assert_eq!((own, started), (before, before));
            assert_eq!(slice_of(0), SHORT_SLICE_NS.min(before), "short again after");
        })
        .join()
        .unwrap();
    }
}
