//! The embedded SQLite history of builds and jobs, and the reports rendered from it.
pub mod chart;
