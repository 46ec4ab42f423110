//! Builds `tests/c/api_test.c` with gcc against `include/strata.h` and `libstrata.so` (straight
//! from the build, and through `install.sh`'s pkg-config file), and runs it with a fresh random
//! seed and a deadline.

use std::path::Path;
use std::process::Command;

mod common;
use common::{compile, direct_flags, lib_dir, manifest, run_checked, temp_dir};

/// Compiles api_test.c with `flags`, runs it in `dir` and checks its summary.
fn build_and_run(dir: &Path, flags: &[String]) {
    let exe = compile("api_test", dir, flags);
    run_checked(&exe, &[dir.as_os_str()], false);
}

#[test]
fn c_program_uses_the_cpu_side_calls() {
    let dir = temp_dir("direct");
    build_and_run(&dir, &direct_flags());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn installed_pkg_config_file_builds_the_program() {
    let dir = temp_dir("install");
    let prefix = dir.join("prefix");
    let out = Command::new("bash")
        .arg(manifest().join("install.sh"))
        .arg(&prefix)
        .arg(lib_dir())
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "install.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "lib/libstrata.so",
        "include/strata.h",
        "include/strata.cuh",
        "include/strata/fault.cuh",
        "include/strata/tier_ring.cuh",
        "lib/cmake/Strata/StrataConfig.cmake",
        "lib/cmake/Strata/StrataConfigVersion.cmake",
    ] {
        assert!(prefix.join(f).exists(), "install.sh did not install {f}");
    }
    let pc = Command::new("pkg-config")
        .args(["--cflags", "--libs", "strata"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("pkg-config runs (install pkg-config)");
    assert!(
        pc.status.success(),
        "pkg-config strata failed:\n{}",
        String::from_utf8_lossy(&pc.stderr)
    );
    let flags: Vec<String> = String::from_utf8_lossy(&pc.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert!(
        flags.iter().any(|f| f == "-lstrata"),
        "pkg-config flags lack -lstrata: {flags:?}"
    );
    build_and_run(&dir, &flags);
    std::fs::remove_dir_all(&dir).ok();
}
