//! `headroom sim`: not built yet.

/// Arguments of `headroom sim`.
#[derive(clap::Args)]
pub struct SimArgs {}

pub fn main(_args: SimArgs) -> anyhow::Result<u8> {
    anyhow::bail!("`headroom sim` is not built yet")
}
