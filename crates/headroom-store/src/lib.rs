//! The embedded SQLite history of builds and jobs.
//!
//! The history is what lets `headroom build` predict a job's peak before it runs; the same
//! records, loaded back as a [`BuildReport`], feed the reports `headroom_report` renders.

pub mod history;
pub mod known;
pub mod projects;
pub mod recorder;
pub mod shared;
pub mod shown;

/// The report model lives in a crate of its own, without SQLite, for readers of reports.
pub use headroom_report::{
    BuildRecord, BuildReport, JobEvent, JobEventKind, JobRecord, OutsideProcess, Room, Sample,
};
pub use history::{History, Listed, Opened, StoreError};
pub use shared::{SharedPeak, Taken};
