//! Shared stores behind a URL (`s3://`, `redis://`, `webdav+http(s)://`, `file://`), so that
//! machines share what one of them built instead of each building or importing it.
//!
//! [`store`] is the generic part: content-addressed blobs and namespaced entries, checked keys,
//! whole writes, redacted messages. [`kernels`] keeps the kernel cache in the `kernels/`
//! namespace, [`history`] the measured peaks of builds in the `history/` namespace.

pub mod address;
pub mod history;
pub mod kernels;
pub mod store;

pub use store::{Store, StoreError};
