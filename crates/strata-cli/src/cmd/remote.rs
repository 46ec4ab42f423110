//! `strata` commands for this area (not built yet: each returns an error that says so).

/// Arguments (none yet).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

/// Not built yet.
pub fn serve(_args: &ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet; see the open issues")
}

/// Arguments (none yet).
#[derive(Debug, clap::Args)]
pub struct RemoteBenchArgs {}

/// Not built yet.
pub fn bench(_args: &RemoteBenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet; see the open issues")
}
