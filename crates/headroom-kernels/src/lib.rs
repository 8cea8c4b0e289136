//! Multi-target GPU kernel manifests, toolchains, a content-addressed cache and a runtime resolver.

pub mod resolve;
pub mod target;
