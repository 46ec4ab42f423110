//! Run-time compilation of CUDA C++ through NVRTC, to CUBIN for one architecture, with
//! `strata.cuh` supplied in memory and a persistent on-disk cache keyed by a hash of the
//! source, the header, the options, the architecture and the NVRTC version.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys;

/// The device header users' kernels include (`#include "strata.cuh"`); it includes the files
/// of [`HEADERS`].
pub const STRATA_CUH: &str = include_str!("../cuda/strata.cuh");

/// Every device header by the name kernels and headers include it with: `strata.cuh` and the
/// files under `strata/` (one concept each: layout, policies, the eviction sweep, each tier,
/// the fault path, the access API).
pub const HEADERS: &[(&str, &str)] = &[
    ("strata.cuh", STRATA_CUH),
    (
        "strata/layout.cuh",
        include_str!("../cuda/strata/layout.cuh"),
    ),
    (
        "strata/primitives.cuh",
        include_str!("../cuda/strata/primitives.cuh"),
    ),
    (
        "strata/policy_clock.cuh",
        include_str!("../cuda/strata/policy_clock.cuh"),
    ),
    (
        "strata/policy_scan_resistant.cuh",
        include_str!("../cuda/strata/policy_scan_resistant.cuh"),
    ),
    ("strata/evict.cuh", include_str!("../cuda/strata/evict.cuh")),
    ("strata/copy.cuh", include_str!("../cuda/strata/copy.cuh")),
    (
        "strata/sectors.cuh",
        include_str!("../cuda/strata/sectors.cuh"),
    ),
    (
        "strata/tier_host_copy.cuh",
        include_str!("../cuda/strata/tier_host_copy.cuh"),
    ),
    (
        "strata/tier_ring.cuh",
        include_str!("../cuda/strata/tier_ring.cuh"),
    ),
    (
        "strata/tier_peer.cuh",
        include_str!("../cuda/strata/tier_peer.cuh"),
    ),
    ("strata/tiers.cuh", include_str!("../cuda/strata/tiers.cuh")),
    ("strata/fault.cuh", include_str!("../cuda/strata/fault.cuh")),
    (
        "strata/remote.cuh",
        include_str!("../cuda/strata/remote.cuh"),
    ),
    (
        "strata/write_back.cuh",
        include_str!("../cuda/strata/write_back.cuh"),
    ),
    (
        "strata/access.cuh",
        include_str!("../cuda/strata/access.cuh"),
    ),
];

/// Writes [`HEADERS`] under `dir` (`dir/strata.cuh`, `dir/strata/*.cuh`) for nvcc users.
///
/// # Errors
/// A directory or file could not be written.
pub fn write_headers(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("strata"))?;
    for (name, text) in HEADERS {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}
/// Strata's own maintenance kernels.
pub const STRATA_KERNELS_CU: &str = include_str!("../cuda/strata_kernels.cu");

/// Why a compile failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// libnvrtc could not be loaded.
    #[error(
        "NVRTC not found (libnvrtc.so could not be loaded): install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib directory on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// The source did not compile; `log` is NVRTC's output.
    #[error("kernel {name} failed to compile for {arch}:\n{log}")]
    Source {
        /// Program name.
        name: String,
        /// Target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// An NVRTC call failed outside compilation proper.
    #[error("NVRTC call {call} failed: {message}")]
    Call {
        /// The function.
        call: &'static str,
        /// NVRTC's description.
        message: String,
    },
    /// The source held a NUL byte.
    #[error("kernel source contains a NUL byte; remove it")]
    Nul,
}

/// Whether NVRTC can be loaded.
pub fn available() -> bool {
    crate::probe::nvrtc_present()
}

/// NVRTC's version (major, minor).
pub fn version() -> Result<(i32, i32), CompileError> {
    if !available() {
        return Err(CompileError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers.
    let rc = unsafe { sys::nvrtcVersion(&raw mut major, &raw mut minor) };
    nv_check(rc, "nvrtcVersion")?;
    Ok((major, minor))
}

fn nv_check(rc: sys::nvrtcResult, call: &'static str) -> Result<(), CompileError> {
    if rc == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static C string.
    let message = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(rc)) }
        .to_string_lossy()
        .into_owned();
    Err(CompileError::Call { call, message })
}

/// Owns an nvrtcProgram and destroys it on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&raw mut self.0);
        }
    }
}

/// Compiles `source` (which may `#include "strata.cuh"`) to CUBIN for `arch` (e.g. `sm_90`).
/// No cache: see [`compile_cached`].
pub fn compile(
    source: &str,
    name: &str,
    arch: &str,
    extra_options: &[String],
) -> Result<Vec<u8>, CompileError> {
    if !available() {
        return Err(CompileError::NoNvrtc);
    }
    let src = CString::new(source).map_err(|_| CompileError::Nul)?;
    let cname = CString::new(name).map_err(|_| CompileError::Nul)?;
    let texts = HEADERS
        .iter()
        .map(|(_, text)| CString::new(*text))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| CompileError::Nul)?;
    let names = HEADERS
        .iter()
        .map(|(name, _)| CString::new(*name))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| CompileError::Nul)?;
    let headers: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
    let include_names: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string (`texts`, `names` outlive the
    // call); the two arrays have one entry per header.
    let rc = unsafe {
        sys::nvrtcCreateProgram(
            &raw mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            c_int::try_from(headers.len()).unwrap_or(c_int::MAX),
            headers.as_ptr(),
            include_names.as_ptr(),
        )
    };
    nv_check(rc, "nvrtcCreateProgram")?;
    let prog = Program(prog);
    let mut options: Vec<CString> = vec![
        CString::new(format!("--gpu-architecture={arch}")).map_err(|_| CompileError::Nul)?,
        CString::new("-std=c++17").map_err(|_| CompileError::Nul)?,
    ];
    for o in extra_options {
        options.push(CString::new(o.as_str()).map_err(|_| CompileError::Nul)?);
    }
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `option_ptrs` holds live C strings for the call's duration.
    let rc = unsafe {
        sys::nvrtcCompileProgram(
            prog.0,
            c_int::try_from(option_ptrs.len()).unwrap_or(c_int::MAX),
            option_ptrs.as_ptr(),
        )
    };
    let log = program_log(&prog)?;
    if rc == sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
        return Err(CompileError::Source {
            name: name.into(),
            arch: arch.into(),
            log,
        });
    }
    nv_check(rc, "nvrtcCompileProgram")?;
    let mut size = 0usize;
    nv_check(
        // SAFETY: compiled program; valid out-pointer.
        unsafe { sys::nvrtcGetCUBINSize(prog.0, &raw mut size) },
        "nvrtcGetCUBINSize",
    )?;
    if size == 0 {
        return Err(CompileError::Call {
            call: "nvrtcGetCUBIN",
            message: format!(
                "no CUBIN produced: give a real architecture such as sm_90, not {arch}"
            ),
        });
    }
    let mut cubin = vec![0u8; size];
    nv_check(
        // SAFETY: `cubin` has the size NVRTC reported.
        unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) },
        "nvrtcGetCUBIN",
    )?;
    Ok(cubin)
}

fn program_log(prog: &Program) -> Result<String, CompileError> {
    let mut size = 0usize;
    nv_check(
        // SAFETY: valid program and out-pointer.
        unsafe { sys::nvrtcGetProgramLogSize(prog.0, &raw mut size) },
        "nvrtcGetProgramLogSize",
    )?;
    let mut buf = vec![0u8; size.max(1)];
    nv_check(
        // SAFETY: `buf` has the size NVRTC reported.
        unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr().cast()) },
        "nvrtcGetProgramLog",
    )?;
    Ok(String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .trim()
        .to_string())
}

/// The kernel cache directory: `STRATA_KERNEL_CACHE`, else `$XDG_CACHE_HOME/strata/kernels`,
/// else `$HOME/.cache/strata/kernels`, else a directory under the system temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STRATA_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Path::new(&d).join("strata/kernels");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return Path::new(&h).join(".cache/strata/kernels");
    }
    std::env::temp_dir().join("strata-kernels")
}

/// 128-bit FNV-1a: stable across builds and platforms (the cache key must not change with
/// the Rust version, as `DefaultHasher` may).
pub fn fnv128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;
    let mut h = OFFSET;
    for part in parts {
        for &b in *part {
            h ^= u128::from(b);
            h = h.wrapping_mul(PRIME);
        }
        // Separator, so ("ab","c") and ("a","bc") differ.
        h ^= 0xFF;
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// Where a compile came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from the disk cache.
    Hit,
    /// Compiled now (and stored, if the cache directory is writable).
    Compiled,
}

/// Like [`compile`], through the disk cache. A cache that cannot be written only costs time.
pub fn compile_cached(
    source: &str,
    name: &str,
    arch: &str,
    extra_options: &[String],
) -> Result<(Vec<u8>, CacheOutcome), CompileError> {
    let (major, minor) = version()?;
    let nv = format!("{major}.{minor}");
    let opts = extra_options.join("\u{1}");
    let mut parts: Vec<&[u8]> = vec![source.as_bytes()];
    parts.extend(HEADERS.iter().map(|(_, text)| text.as_bytes()));
    parts.extend([arch.as_bytes(), opts.as_bytes(), nv.as_bytes()]);
    let key = fnv128(&parts);
    let dir = cache_dir();
    let path = dir.join(format!("{key:032x}.cubin"));
    if let Ok(bytes) = std::fs::read(&path)
        && !bytes.is_empty()
    {
        return Ok((bytes, CacheOutcome::Hit));
    }
    let cubin = compile(source, name, arch, extra_options)?;
    if std::fs::create_dir_all(&dir).is_ok() {
        // Write to a temporary name and rename, so a concurrent reader never sees half a file.
        let tmp = dir.join(format!("{key:032x}.{}.tmp", std::process::id()));
        if std::fs::write(&tmp, &cubin).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok((cubin, CacheOutcome::Compiled))
}
