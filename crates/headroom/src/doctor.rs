//! `headroom doctor`: not built yet.

/// Arguments of `headroom doctor`.
#[derive(clap::Args)]
pub struct DoctorArgs {}

pub fn main(_args: DoctorArgs) -> anyhow::Result<u8> {
    anyhow::bail!("`headroom doctor` is not built yet")
}
