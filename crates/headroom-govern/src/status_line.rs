//! How a governed build stands, in one line for people: `2 running, 1 stopped to make room,
//! 5 waiting for memory (the next needs 1.40 GiB) · 4.20 GiB of 6.00 GiB · 12 done`.
//! `headroom build`'s live status on the terminal and `headroom status --verbose` both print
//! it, from the [`BuildStatus`] the governor answers with.

use headroom_size::Size;

use crate::protocol::{BuildStatus, Waiting};

/// The status line's text, such as `2 running, 1 stopped, 5 waiting for memory (the next
/// needs 1.40 GiB) · 4.20 GiB of 6.00 GiB · 12 done`.
pub fn describe(status: &BuildStatus) -> String {
    let mut jobs = vec![format!("{} running", status.running)];
    if status.stopped > 0 {
        jobs.push(format!("{} stopped to make room", status.stopped));
    }
    if status.waiting > 0 {
        let why = match status.waiting_for {
            Some(Waiting::Slots) => format!(" for a slot (all {} busy)", status.slots),
            Some(Waiting::Memory { need }) => {
                format!(" for memory (the next needs {})", Size(need))
            }
            Some(Waiting::Alone) => ": a job that ran out of memory runs alone".to_string(),
            Some(Waiting::OtherSessions { jobs, held }) => format!(
                " for other sessions ({jobs} of their jobs hold {}; `headroom status` lists them)",
                Size(held)
            ),
            None => String::new(),
        };
        jobs.push(format!("{} waiting{why}", status.waiting));
    }
    format!(
        "{} · {} of {} · {} done",
        jobs.join(", "),
        Size(status.used),
        Size(status.budget),
        status.done
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn status(waiting: usize, waiting_for: Option<Waiting>) -> BuildStatus {
        BuildStatus {
            running: 2,
            stopped: 0,
            waiting,
            done: 12,
            used: 1536 * MIB,
            budget: 6144 * MIB,
            slots: 2,
            waiting_for,
        }
    }

    #[test]
    fn the_status_says_what_runs_what_waits_and_why() {
        assert_eq!(
            describe(&status(0, None)),
            "2 running · 1.50 GiB of 6.00 GiB · 12 done"
        );
        assert_eq!(
            describe(&status(5, Some(Waiting::Slots))),
            "2 running, 5 waiting for a slot (all 2 busy) · 1.50 GiB of 6.00 GiB · 12 done"
        );
        assert_eq!(
            describe(&BuildStatus {
                stopped: 1,
                ..status(3, Some(Waiting::Memory { need: 1434 * MIB }))
            }),
            "2 running, 1 stopped to make room, 3 waiting for memory (the next needs 1.40 GiB) \
             · 1.50 GiB of 6.00 GiB · 12 done"
        );
        assert_eq!(
            describe(&status(4, Some(Waiting::Alone))),
            "2 running, 4 waiting: a job that ran out of memory runs alone · 1.50 GiB of 6.00 GiB \
             · 12 done"
        );
    }
}
