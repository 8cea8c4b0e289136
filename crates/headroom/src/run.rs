//! `headroom run`: not built yet.

/// Arguments of `headroom run`.
#[derive(clap::Args)]
pub struct RunArgs {}

pub fn main(_args: RunArgs) -> anyhow::Result<u8> {
    anyhow::bail!("`headroom run` is not built yet")
}
