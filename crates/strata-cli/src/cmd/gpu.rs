//! `strata` commands for this area (not built yet: each returns an error that says so).

/// Arguments (none yet).
#[derive(Debug, clap::Args)]
pub struct GpuMicroArgs {}

/// Not built yet.
pub fn micro(_args: &GpuMicroArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet; see the open issues")
}
