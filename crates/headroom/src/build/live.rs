//! The live status of `headroom build` on a terminal: jobs running, stopped and waiting,
//! memory against the budget, and what the waiting jobs wait for, asked of the governor a few
//! times a second. A long build otherwise shows nothing of headroom for minutes.
//!
//! The build writes to the terminal itself, past headroom, so a status line drawn among its
//! output would be torn by it. The status therefore keeps the terminal's last line to itself:
//! the lines above scroll as a region of their own (as apt and dpkg show their progress), and
//! indicatif draws the status on that last line, each draw written at once between saving
//! and restoring the cursor, so that it never lands inside the build's output.

use std::fmt;
use std::io::{self, IsTerminal, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use headroom_govern::session::Session;
use headroom_govern::status_line;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

/// How often the governor is asked how the build stands.
const ASK_EVERY: Duration = Duration::from_millis(300);
/// How long one answer may take; past it the status stays as it was.
const ANSWER_BOUND: Duration = Duration::from_millis(200);
/// How often the spinner and the elapsed time move.
const TICK: Duration = Duration::from_millis(250);

/// The status shown while the build runs; dropping it clears the status and gives the
/// terminal its last line back.
pub struct LiveStatus {
    bar: ProgressBar,
    screen: Arc<Screen>,
    next_ask: Instant,
}

impl LiveStatus {
    /// A live status on stderr, when stderr is a terminal that can show one (not `TERM=dumb`,
    /// at least three rows). Made before the build starts: it takes the last line while
    /// nothing else writes to the terminal.
    pub fn on_terminal() -> Option<LiveStatus> {
        let dumb = std::env::var_os("TERM").is_some_and(|term| term == "dumb");
        if !io::stderr().is_terminal() || dumb {
            return None;
        }
        let screen = Arc::new(Screen::take(Box::new(io::stderr()), stderr_size)?);
        let target = ProgressDrawTarget::term_like(Box::new(LastLine(Arc::clone(&screen))));
        let bar = ProgressBar::with_draw_target(None, target);
        if let Ok(style) = ProgressStyle::with_template("{spinner} headroom: {wide_msg} {elapsed}")
        {
            bar.set_style(style);
        }
        bar.set_message("starting");
        bar.enable_steady_tick(TICK);
        Some(LiveStatus {
            bar,
            screen,
            next_ask: Instant::now(),
        })
    }

    /// Asks the governor how the build stands, at most every [`ASK_EVERY`], and shows it.
    pub fn refresh(&mut self, session: &Session) {
        if Instant::now() < self.next_ask {
            return;
        }
        if let Some(status) = session.status(ANSWER_BOUND) {
            self.bar.set_message(status_line::describe(&status));
        }
        self.next_ask = Instant::now() + ASK_EVERY;
    }
}

impl Drop for LiveStatus {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
        self.screen.give_back();
    }
}

/// The terminal's size as `(rows, columns)`, from stderr.
fn stderr_size() -> Option<(u16, u16)> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `size`.
    let read = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) };
    (read == 0).then_some((size.ws_row, size.ws_col))
}

/// Whether this process is in the terminal's foreground: a build sent to the background
/// (`bg`) must not draw over what the shell's foreground job shows.
fn in_foreground() -> bool {
    // SAFETY: tcgetpgrp and getpgrp only read this process's terminal and group.
    unsafe { libc::tcgetpgrp(libc::STDERR_FILENO) == libc::getpgrp() }
}

/// A terminal whose last line headroom keeps to itself while the build scrolls above it.
struct Screen {
    out: Mutex<Box<dyn Write + Send>>,
    /// The terminal's size: `(rows, columns)`.
    size: fn() -> Option<(u16, u16)>,
    /// Whether drawing goes on: only while this process is in the terminal's foreground.
    drawing: fn() -> bool,
    /// The size the scrolling region was set for; `None` once the line is given back.
    region: Mutex<Option<(u16, u16)>>,
    /// What indicatif drew since its last flush.
    pending: Mutex<Vec<u8>>,
}

impl fmt::Debug for Screen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Screen")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// Locks `mutex`, poisoned or not: a panicking draw must not leave the terminal unrestored.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Screen {
    /// Takes the last line of a terminal of `size` that `out` writes to; `None` when the
    /// terminal is too small to spare one. A new line first, then the cursor back up: what
    /// was on the last line moves up, out of the line taken.
    fn take(out: Box<dyn Write + Send>, size: fn() -> Option<(u16, u16)>) -> Option<Screen> {
        Self::take_drawing_when(out, size, in_foreground)
    }

    fn take_drawing_when(
        out: Box<dyn Write + Send>,
        size: fn() -> Option<(u16, u16)>,
        drawing: fn() -> bool,
    ) -> Option<Screen> {
        let (rows, columns) = size().filter(|&(rows, columns)| rows >= 3 && columns >= 20)?;
        let screen = Screen {
            out: Mutex::new(out),
            size,
            drawing,
            region: Mutex::new(Some((rows, columns))),
            pending: Mutex::new(Vec::new()),
        };
        screen.write(format!("\n\x1b7{}\x1b8\x1b[1A", set_region(rows)).as_bytes());
        Some(screen)
    }

    /// Draws what indicatif drew on the last line, at once, and sets the scrolling region
    /// again if the terminal was resized.
    fn draw(&self) {
        let drawn = std::mem::take(&mut *lock(&self.pending));
        let mut region = lock(&self.region);
        let (Some(set), Some((rows, columns))) = (*region, (self.size)()) else {
            return;
        };
        if !(self.drawing)() || rows < 3 {
            return;
        }
        // One row at most, whatever indicatif padded it to: a line that wrapped on the last
        // row would scroll the whole terminal. Every character of the status is one column.
        let drawn: String = String::from_utf8_lossy(&drawn)
            .chars()
            .take(usize::from(columns.saturating_sub(1)))
            .collect();
        let mut frame = b"\x1b7".to_vec();
        if set != (rows, columns) {
            frame.extend_from_slice(set_region(rows).as_bytes());
            *region = Some((rows, columns));
        }
        frame.extend_from_slice(format!("\x1b[{rows};1H\r\x1b[2K").as_bytes());
        frame.extend_from_slice(drawn.trim_end().as_bytes());
        frame.extend_from_slice(b"\x1b8");
        self.write(&frame);
    }

    /// Gives the last line back: the whole terminal scrolls again, and the line is cleared.
    fn give_back(&self) {
        let Some((rows, _)) = lock(&self.region).take() else {
            return;
        };
        let rows = (self.size)().map_or(rows, |(rows, _)| rows);
        self.write(format!("\x1b7\x1b[r\x1b[{rows};1H\x1b[2K\x1b8").as_bytes());
    }

    /// One write, so that no output of the build lands inside it.
    fn write(&self, bytes: &[u8]) {
        let mut out = lock(&self.out);
        let _ = out.write_all(bytes).and_then(|()| out.flush());
    }
}

/// The scrolling region of a terminal of `rows` rows: all but the last.
fn set_region(rows: u16) -> String {
    format!("\x1b[1;{}r", rows - 1)
}

/// indicatif's terminal: one line, the last, of [`Screen`].
#[derive(Debug)]
struct LastLine(Arc<Screen>);

impl TermLike for LastLine {
    fn width(&self) -> u16 {
        // One column short: text up to the last column would leave the cursor about to wrap.
        (self.0.size)().map_or(80, |(_, columns)| columns.saturating_sub(1))
    }

    fn height(&self) -> u16 {
        // Tall enough that indicatif never leaves out a line it measures as wrapping: the
        // draw cuts it to the line's width instead.
        (self.0.size)().map_or(24, |(rows, _)| rows)
    }

    // The status is one line, always drawn from the start of the last one.
    fn move_cursor_up(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_down(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_right(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_left(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn write_line(&self, line: &str) -> io::Result<()> {
        self.write_str(line)
    }

    fn write_str(&self, text: &str) -> io::Result<()> {
        lock(&self.0.pending).extend_from_slice(text.as_bytes());
        Ok(())
    }

    fn clear_line(&self) -> io::Result<()> {
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.0.draw();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a [`Screen`] wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl Write for Written {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            lock(&self.0).extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Written {
        fn take(&self) -> String {
            String::from_utf8(std::mem::take(&mut *lock(&self.0))).unwrap()
        }
    }

    fn terminal_24_by_80() -> Option<(u16, u16)> {
        Some((24, 80))
    }

    #[test]
    fn the_status_keeps_the_last_line_and_gives_it_back() {
        let written = Written::default();
        let screen = Arc::new(
            Screen::take_drawing_when(Box::new(written.clone()), terminal_24_by_80, || true)
                .unwrap(),
        );
        // The rows above scroll on their own; the cursor goes back where it was.
        assert_eq!(written.take(), "\n\x1b7\x1b[1;23r\x1b8\x1b[1A");
        let line = LastLine(Arc::clone(&screen));
        assert_eq!(line.width(), 79);
        line.clear_line().unwrap();
        line.write_str("2 running").unwrap();
        line.flush().unwrap();
        assert_eq!(written.take(), "\x1b7\x1b[24;1H\r\x1b[2K2 running\x1b8");
        screen.give_back();
        assert_eq!(written.take(), "\x1b7\x1b[r\x1b[24;1H\x1b[2K\x1b8");
        line.write_str("late").unwrap();
        line.flush().unwrap();
        screen.give_back();
        assert_eq!(
            written.take(),
            "",
            "nothing is drawn once the line is given back"
        );
    }

    #[test]
    fn a_background_build_draws_nothing_and_a_small_terminal_has_no_status() {
        let written = Written::default();
        let screen =
            Screen::take_drawing_when(Box::new(written.clone()), terminal_24_by_80, || false)
                .unwrap();
        written.take();
        let line = LastLine(Arc::new(screen));
        line.write_str("2 running").unwrap();
        line.flush().unwrap();
        assert_eq!(written.take(), "");
        let tiny = || Some((2, 80));
        assert!(Screen::take(Box::new(written.clone()), tiny).is_none());
        assert_eq!(written.take(), "");
    }
}
