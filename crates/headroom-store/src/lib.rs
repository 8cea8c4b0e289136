//! The embedded SQLite history of builds and jobs, and the reports rendered from it.
//!
//! The history is what lets `headroom build` predict a job's peak before it runs; the same
//! records, loaded back as a [`BuildReport`], feed the terminal summary, JSON and HTML reports.

pub mod build_page;
pub mod chart;
pub mod history;
pub mod html;
pub mod known;
pub mod projects;
pub mod recorder;
pub mod shared;
pub mod summary;

/// The report model lives in a crate of its own, without SQLite, for readers of reports.
pub use headroom_report as model;
pub use headroom_report::{
    BuildRecord, BuildReport, JobEvent, JobEventKind, JobRecord, OutsideProcess, Room, Sample,
};
pub use history::{History, Listed, Opened, StoreError};
pub use shared::{SharedPeak, Taken};
