//! What a whole-file write through `headroom_paths::atomic::write` (temp file, fsync, rename,
//! directory fsync) costs against a plain write and rename, in the directory given: the
//! governor publishes its ledger entry this way at every sample (tmpfs, `/dev/shm`), the
//! reports and the kernel cache's records once per file (a disk).
//!
//! `cargo run --release -p headroom-paths --example atomic_cost -- DIR`

use std::time::Instant;

const WRITES: u32 = 2000;

fn main() {
    let Some(dir) = std::env::args_os().nth(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: atomic_cost DIR (a directory to write in, made if missing)");
        std::process::exit(2);
    };
    std::fs::create_dir_all(&dir).expect("the directory can be made");
    let path = dir.join("entry");
    for round in 0..3 {
        let started = Instant::now();
        for i in 0..WRITES {
            let temporary = path.with_extension("new");
            std::fs::write(&temporary, format!("{i} 1 2\n")).expect("write");
            std::fs::rename(&temporary, &path).expect("rename");
        }
        let plain = per_write_us(started);
        let started = Instant::now();
        for i in 0..WRITES {
            headroom_paths::atomic::write(&path, format!("{i} 1 2\n").as_bytes(), ".tmp")
                .expect("atomic write");
        }
        let atomic = per_write_us(started);
        println!(
            "round {round}: write+rename {plain:.1} us, atomic::write {atomic:.1} us, ratio {:.2}",
            atomic / plain
        );
    }
    let _ = std::fs::remove_file(&path);
}

fn per_write_us(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e6 / f64::from(WRITES)
}
