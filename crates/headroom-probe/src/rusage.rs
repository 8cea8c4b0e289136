//! The kernel's own peak-memory accounting for finished children (`getrusage(RUSAGE_CHILDREN)`),
//! used to cross-check a sampled peak: sampling can miss a short spike, the kernel cannot.

/// `getrusage(who)`, or `None` when the kernel refuses.
fn usage(who: libc::c_int) -> Option<libc::rusage> {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    (unsafe { libc::getrusage(who, &mut usage) } == 0).then_some(usage)
}

fn seconds(tv: libc::timeval) -> f64 {
    tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6
}

/// The largest peak resident set (`ru_maxrss`) of any waited-for descendant of this process, in
/// bytes. This is a per-process maximum, not a sum over the tree.
pub fn children_max_rss() -> u64 {
    // Linux reports ru_maxrss in KiB.
    usage(libc::RUSAGE_CHILDREN).map_or(0, |u| u64::try_from(u.ru_maxrss).unwrap_or(0) * 1024)
}

/// CPU time (user + system) of all waited-for descendants of this process, in milliseconds.
pub fn children_cpu_ms() -> u64 {
    usage(libc::RUSAGE_CHILDREN).map_or(0, |u| {
        ((seconds(u.ru_utime) + seconds(u.ru_stime)) * 1000.0) as u64
    })
}

/// CPU time (user + system) this process itself has used, in seconds: what a sampler costs.
pub fn self_cpu_seconds() -> f64 {
    usage(libc::RUSAGE_SELF).map_or(0.0, |u| seconds(u.ru_utime) + seconds(u.ru_stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn sees_a_waited_child_peak_in_bytes() {
        // dd reads 64 MiB from /dev/zero into one buffer, so its resident peak is at least that.
        let status = std::process::Command::new("dd")
            .args([
                "if=/dev/zero",
                "of=/dev/null",
                "bs=64M",
                "count=1",
                "status=none",
            ])
            .status()
            .unwrap();
        assert!(status.success());
        // A reader that forgot KiB -> bytes would see 64 KiB; one of this process, a few MiB.
        let peak = children_max_rss();
        assert!(peak >= 64 * MIB, "{peak} bytes");
        assert!(peak < 64 * 1024 * MIB, "{peak} bytes");
    }

    /// This process's CPU time from a clock independent of getrusage.
    fn process_cpu_seconds() -> f64 {
        // SAFETY: clock_gettime only writes into the zeroed struct we pass.
        let mut now: libc::timespec = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) },
            0
        );
        now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
    }

    #[test]
    fn own_cpu_time_agrees_with_the_process_clock() {
        // Burn a fifth of a CPU second, however long a loaded machine makes that take.
        let start = process_cpu_seconds();
        while process_cpu_seconds() - start < 0.2 {
            std::hint::black_box(0u64.wrapping_add(1));
        }
        let low = process_cpu_seconds();
        let read = self_cpu_seconds();
        let high = process_cpu_seconds();
        // getrusage and the clock count the same time: microseconds misread as milliseconds,
        // a missing system part or the children's time instead would leave this window.
        assert!(
            read >= low - 0.05 && read <= high + 0.05,
            "getrusage says {read} s, the clock {low}..{high} s"
        );
    }
}
