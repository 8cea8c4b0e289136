//! `reap_all` waits for any child of the process, so it runs alone in a test binary of its
//! own: beside other tests it would reap their children.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

/// Blocks until `pid` has exited, without reaping it.
fn wait_exited(pid: i32) {
    // SAFETY: waitid writes only into the zeroed siginfo we pass.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let waited = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    assert_eq!(waited, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn reaping_returns_the_childs_end_and_reaps_the_others_too() {
    let other = Command::new("true").spawn().unwrap().id() as i32;
    let child = Command::new("sh")
        .args(["-c", "kill -TERM $$"])
        .spawn()
        .unwrap()
        .id() as i32;
    wait_exited(other);
    wait_exited(child);
    let status = headroom_process::reap_all(child).expect("the child has ended");
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert_eq!(headroom_process::reap_all(child), None, "reaped once");
    // SAFETY: waitpid on a pid this test started; it was reaped, so ECHILD.
    let again = unsafe { libc::waitpid(other, std::ptr::null_mut(), libc::WNOHANG) };
    assert_eq!(again, -1, "the other child was reaped too");
}
