//! `strata` commands for this area (not built yet: each returns an error that says so).

/// Arguments (none yet).
#[derive(Debug, clap::Args)]
pub struct GraphArgs {}

/// Not built yet.
pub fn graph(_args: &GraphArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet; see the open issues")
}

/// Arguments (none yet).
#[derive(Debug, clap::Args)]
pub struct EmbedArgs {}

/// Not built yet.
pub fn embed(_args: &EmbedArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet; see the open issues")
}
