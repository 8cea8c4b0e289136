//! Per-project peaks from the build history, so `headroom doctor` can say which projects built
//! before would not fit on this machine, and which of them headroom never really saw: peaks
//! of a build that governed nothing, or whose compilers ran outside admission, say nothing of
//! what the project needs. A project is the directory a build ran in.

use rusqlite::{Connection, OpenFlags};
use serde::Serialize;

use crate::history::{History, StoreError};

/// What the history knows about one project's memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProjectPeak {
    pub cwd: String,
    /// The command of its most recent build.
    pub last_command: String,
    pub builds: u64,
    pub last_started_unix_ms: i64,
    /// The highest total memory any of its builds reached.
    pub peak_total: u64,
    /// The highest peak of a single job (compiler or link): a machine needs at least this
    /// much to build the project even one job at a time.
    pub largest_job: u64,
    /// Its most recent build that compiled anything, governed or not (a rebuild with nothing
    /// to do says nothing), else its most recent build; for `headroom report`.
    pub latest_build_id: i64,
    /// Jobs that went through admission in that build; 0 means headroom governed nothing
    /// there, and its peaks tell nothing.
    pub latest_jobs: u64,
    /// Compilers, linkers and their inner tools that ran outside admission in that build:
    /// their peaks are not in `largest_job`.
    pub latest_ungoverned_compilers: u64,
}

impl ProjectPeak {
    /// Its most recent build admitted no job at all.
    pub fn governed_nothing(&self) -> bool {
        self.latest_jobs == 0
    }
}

/// Every project in `history`, the hungriest first.
pub fn project_peaks(history: &History) -> Result<Vec<ProjectPeak>, StoreError> {
    let path = history.path();
    let sqlite = |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    // A read-only connection of our own: the query must never take the writers' lock.
    let conn =
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(sqlite)?;
    let mut query = conn
        .prepare(
            "WITH latest AS (
                 SELECT p.cwd,
                        (SELECT l.id FROM builds l WHERE l.cwd = p.cwd
                         ORDER BY (EXISTS (SELECT 1 FROM jobs j WHERE j.build_id = l.id)
                                   OR EXISTS (SELECT 1 FROM outside_processes o
                                              WHERE o.build_id = l.id AND o.compiler_like)) DESC,
                                  l.started_unix_ms DESC, l.id DESC LIMIT 1) AS id
                 FROM builds p
                 GROUP BY p.cwd
             )
             SELECT b.cwd,
                    lb.command,
                    COUNT(*),
                    MAX(b.started_unix_ms),
                    MAX(COALESCE(b.peak_total, 0)),
                    COALESCE((SELECT MAX(j.peak) FROM jobs j JOIN builds jb ON jb.id = j.build_id WHERE jb.cwd = b.cwd), 0),
                    latest.id,
                    (SELECT COUNT(*) FROM jobs j WHERE j.build_id = latest.id),
                    (SELECT COUNT(*) FROM outside_processes o WHERE o.build_id = latest.id AND o.compiler_like)
             FROM builds b
             JOIN latest ON latest.cwd = b.cwd
             JOIN builds lb ON lb.id = latest.id
             GROUP BY b.cwd
             ORDER BY 6 DESC, 5 DESC, b.cwd",
        )
        .map_err(sqlite)?;
    let rows = query
        .query_map([], |row| {
            Ok(ProjectPeak {
                cwd: row.get(0)?,
                last_command: row.get(1)?,
                builds: row.get::<_, i64>(2)? as u64,
                last_started_unix_ms: row.get(3)?,
                peak_total: row.get::<_, i64>(4)?.max(0) as u64,
                largest_job: row.get::<_, i64>(5)?.max(0) as u64,
                latest_build_id: row.get(6)?,
                latest_jobs: row.get::<_, i64>(7)? as u64,
                latest_ungoverned_compilers: row.get::<_, i64>(8)? as u64,
            })
        })
        .map_err(sqlite)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(sqlite)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_report::{BuildRecord, JobRecord, OutsideProcess};

    const GIB: u64 = 1 << 30;

    fn build(cwd: &str, started: i64) -> BuildRecord {
        BuildRecord {
            id: 0,
            started_unix_ms: started,
            duration_ms: None,
            command: format!("ninja -C {cwd}/build"),
            cwd: cwd.into(),
            budget: 8 * GIB,
            budget_source: "test".into(),
            slots: 4,
            exit_code: None,
            peak_total: None,
            parallelism_set: Vec::new(),
        }
    }

    fn job(id: u64, peak: u64) -> JobRecord {
        JobRecord {
            job_id: id,
            key: format!("k{id}"),
            group: "g".into(),
            label: format!("unit{id}.cpp"),
            compiler: "g++".into(),
            command: "g++ -c".into(),
            cwd: "/".into(),
            offered_ms: 0,
            start_ms: 0,
            end_ms: 1,
            peak,
            cpu_ms: 1,
            exit_code: Some(0),
            prediction_source: "default".into(),
            attempts: 1,
            ..JobRecord::default()
        }
    }

    #[test]
    fn groups_builds_by_project_and_keeps_the_largest_peaks() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let torch = history.begin_build(&build("/src/torch-ext", 1)).unwrap();
        history
            .record_job(torch, &job(1, 2 * GIB), "portable", None)
            .unwrap();
        history.finish_build(torch, 10, Some(0), 7 * GIB).unwrap();
        let again = history.begin_build(&build("/src/torch-ext", 5)).unwrap();
        history
            .record_job(again, &job(1, 3 * GIB), "portable", None)
            .unwrap();
        history.finish_build(again, 10, Some(0), 5 * GIB).unwrap();
        let small = history.begin_build(&build("/src/tiny", 3)).unwrap();
        history
            .record_job(small, &job(1, GIB / 4), "portable", None)
            .unwrap();
        history.finish_build(small, 10, Some(0), GIB / 2).unwrap();

        let projects = project_peaks(&history).unwrap();
        assert_eq!(projects.len(), 2);
        assert_eq!(projects[0].cwd, "/src/torch-ext");
        assert_eq!(projects[0].builds, 2);
        assert_eq!(projects[0].peak_total, 7 * GIB);
        assert_eq!(projects[0].largest_job, 3 * GIB);
        assert_eq!(projects[0].last_started_unix_ms, 5);
        assert_eq!(projects[1].largest_job, GIB / 4);
        assert_eq!(projects[1].latest_jobs, 1);
        assert!(!projects[0].governed_nothing());
    }

    #[test]
    fn the_latest_build_tells_what_headroom_governed_and_what_ran_outside() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let governed = history.begin_build(&build("/src/bazel", 1)).unwrap();
        history
            .record_job(governed, &job(1, 2 * GIB), "portable", None)
            .unwrap();
        let compiler = |pid, compiler_like| OutsideProcess {
            pid,
            name: if compiler_like { "cc1plus" } else { "bazel" }.into(),
            compiler_like,
            peak: GIB,
            first_seen_ms: 0,
            last_seen_ms: 10,
            reason: "started by a statically linked build driver".into(),
        };
        history
            .record_outside(governed, &[compiler(10, true)])
            .unwrap();
        let unseen = history.begin_build(&build("/src/bazel", 2)).unwrap();
        history
            .record_outside(
                unseen,
                &[compiler(20, true), compiler(21, true), compiler(22, false)],
            )
            .unwrap();

        let projects = project_peaks(&history).unwrap();
        assert_eq!(projects.len(), 1);
        let bazel = &projects[0];
        assert_eq!((bazel.builds, bazel.largest_job), (2, 2 * GIB));
        assert_eq!((bazel.latest_build_id, bazel.latest_jobs), (unseen, 0));
        assert!(bazel.governed_nothing());
        assert_eq!(bazel.latest_ungoverned_compilers, 2);

        // A rebuild with nothing to do compiles nothing: the build before it still speaks.
        history.begin_build(&build("/src/bazel", 3)).unwrap();
        let projects = project_peaks(&history).unwrap();
        assert_eq!(projects[0].builds, 3);
        assert_eq!(projects[0].latest_build_id, unseen);
    }

    #[test]
    fn an_empty_history_has_no_projects() {
        let dir = tempfile::tempdir().unwrap();
        let history = History::open(&dir.path().join("h.sqlite")).unwrap();
        assert!(project_peaks(&history).unwrap().is_empty());
    }
}
