//! What the CUDA driver shows: used by `strata info` and to skip GPU tests clearly.

use cudarc::driver::sys;

/// One visible GPU.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name.
    pub name: String,
    /// Total memory in bytes.
    pub total_bytes: u64,
    /// Free memory in bytes when probed.
    pub free_bytes: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Multiprocessors.
    pub multiprocessors: i32,
    /// PCI address, `dddd:bb:dd.f`.
    pub pci_address: String,
    /// PCIe link as read from sysfs, e.g. `32.0 GT/s PCIe x16`, when readable.
    pub pcie_link: Option<String>,
    /// Ordinals of GPUs this one can access directly (peer-to-peer).
    pub peers: Vec<usize>,
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made.
    unsafe { sys::is_culib_present() }
}

/// Whether the NVRTC library can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen libnvrtc; no NVRTC call is made.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Lists the GPUs the driver shows. `Ok(empty)` with a driver but no GPU; `Err` when the driver
/// is missing or fails.
pub fn gpus() -> Result<Vec<GpuInfo>, String> {
    if !driver_present() {
        return Err("no CUDA driver found (libcuda.so could not be loaded)".into());
    }
    let count = cudarc::driver::CudaContext::device_count().map_err(|e| e.to_string())?;
    let count = usize::try_from(count).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(count);
    for ordinal in 0..count {
        let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| e.to_string())?;
        let attr = |a| ctx.attribute(a).map_err(|e| e.to_string());
        use sys::CUdevice_attribute as A;
        let pci_address = format!(
            "{:04x}:{:02x}:{:02x}.0",
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
        );
        let (free_bytes, total_bytes) = ctx.mem_get_info().map_err(|e| e.to_string())?;
        let mut peers = Vec::new();
        for other in (0..count).filter(|&o| o != ordinal) {
            let mut can = 0;
            // SAFETY: both ordinals are below the device count; `can` is a valid out-pointer.
            let rc = unsafe {
                sys::cuDeviceCanAccessPeer(
                    &raw mut can,
                    i32::try_from(ordinal).map_err(|e| e.to_string())?,
                    i32::try_from(other).map_err(|e| e.to_string())?,
                )
            };
            if rc == sys::CUresult::CUDA_SUCCESS && can != 0 {
                peers.push(other);
            }
        }
        out.push(GpuInfo {
            ordinal,
            name: ctx.name().map_err(|e| e.to_string())?,
            total_bytes: total_bytes as u64,
            free_bytes: free_bytes as u64,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            pcie_link: pcie_link(&pci_address),
            pci_address,
            peers,
        });
    }
    Ok(out)
}

fn pcie_link(address: &str) -> Option<String> {
    let dir = std::path::Path::new("/sys/bus/pci/devices").join(address);
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .map(|s| s.trim().to_string())
    };
    Some(format!(
        "{} x{}",
        read("current_link_speed")?,
        read("current_link_width")?
    ))
}
