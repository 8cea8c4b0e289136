//! `headroom kernels`: not built yet.

/// Arguments of `headroom kernels`.
#[derive(clap::Args)]
pub struct KernelsArgs {}

pub fn main(_args: KernelsArgs) -> anyhow::Result<u8> {
    anyhow::bail!("`headroom kernels` is not built yet")
}
