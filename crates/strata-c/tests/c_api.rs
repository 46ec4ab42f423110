//! Builds `tests/c/api_test.c` with gcc against `include/strata.h` and `libstrata.so` (straight
//! from the build, and through `install.sh`'s pkg-config file), and runs it with a fresh random
//! seed and a deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the `libstrata.so` cargo built for this test run: `deps/` beside the
/// test binary (where `cargo test` leaves it) or the profile directory (after `cargo build`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [deps, deps.parent().expect("target/<profile>")]
        .into_iter()
        .find(|d| d.join("libstrata.so").exists())
        .expect("cargo builds libstrata.so for this test run")
        .to_path_buf()
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-c-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Compiles api_test.c with `flags`, runs it in `dir` and checks its summary.
fn build_and_run(dir: &Path, flags: &[String]) {
    let exe = dir.join("api_test");
    let out = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(manifest().join("tests/c/api_test.c"))
        .args(flags)
        .output()
        .expect("gcc runs (install gcc)");
    assert!(
        out.status.success(),
        "gcc {flags:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seed: u64 = rand::random::<u64>() >> 1;
    println!("seed {seed}");
    let mut child = Command::new(&exe)
        .arg(seed.to_string())
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run api_test");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("api_test did not finish in 60 s (seed {seed})");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(status.success(), "api_test failed (seed {seed}):\n{text}");
    assert!(text.contains(" checks"), "api_test printed no summary");
}

#[test]
fn c_program_uses_the_cpu_side_calls() {
    let lib = lib_dir();
    let dir = temp_dir("direct");
    let flags = vec![
        format!("-I{}", manifest().join("include").display()),
        format!("-L{}", lib.display()),
        "-lstrata".to_string(),
        format!("-Wl,-rpath,{}", lib.display()),
    ];
    build_and_run(&dir, &flags);
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
