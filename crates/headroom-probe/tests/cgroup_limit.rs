//! A real memory cgroup with a real limit: the kernel OOM-kills a process that exceeds it, and
//! `Cgroup` reports the kill, the peak and the limit. Skips, saying why, where no cgroup can be made.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use headroom_probe::cgroup::Cgroup;

#[test]
fn a_process_over_the_limit_is_oom_killed_and_counted() {
    let name = format!("headroom-probe-test-{}", std::process::id());
    let cgroup = match Cgroup::create_under_self(&name, Some(64 << 20)) {
        Ok(cgroup) => cgroup,
        Err(err) => {
            headroom_testkit::skip("cgroup", format!("cannot make a memory cgroup here: {err}"));
            return;
        }
    };
    assert_eq!(cgroup.limit(), Some(64 << 20));
    assert!(cgroup.effective_limit().unwrap() <= 64 << 20);

    // dd reads into one 256 MiB buffer, touching every page of it.
    let mut big = Command::new("dd");
    big.args(["if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]);
    cgroup.attach(&mut big);
    let status = big.status().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "expected an OOM kill, got {status:?}"
    );
    assert!(cgroup.oom_kills() >= 1);

    // A small one fits and its peak is recorded.
    let mut small = Command::new("dd");
    small.args(["if=/dev/zero", "of=/dev/null", "bs=16M", "count=1"]);
    cgroup.attach(&mut small);
    assert!(small.status().unwrap().success());
    assert!(cgroup.peak().unwrap() >= 16 << 20);
    cgroup.remove().unwrap();
}
