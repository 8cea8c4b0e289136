//! Multi-target GPU kernel manifests, toolchains, a content-addressed cache and a runtime resolver.
//!
//! The build side ([`manifest`], [`toolchain`], [`build`], [`exec`], [`cache`], [`bundle`])
//! runs in CI or on a developer machine; the run side ([`resolve`], and [`cache`] for reading)
//! is small and allocation-light so a kernel library can call it at load time.

pub mod build;
pub mod bundle;
pub mod cache;
pub mod deps;
pub mod exec;
pub mod inspect;
pub mod local;
pub mod manifest;
pub mod resolve;
pub mod target;
pub mod toolchain;
