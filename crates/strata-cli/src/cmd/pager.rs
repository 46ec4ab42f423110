//! `strata` commands for this area (not built yet: each returns an error that says so).

/// Arguments (none yet).
#[derive(Debug, clap::Args)]
pub struct StreamArgs {}

/// Not built yet.
pub fn stream(_args: &StreamArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet; see the open issues")
}

/// Arguments (none yet).
#[derive(Debug, clap::Args)]
pub struct PagerBenchArgs {}

/// Not built yet.
pub fn bench(_args: &PagerBenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet; see the open issues")
}
