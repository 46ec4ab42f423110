//! Builds `tests/c/api_test.c` with gcc against `include/strata.h` and `libstrata.so`, and
//! runs it with a fresh random seed and a deadline.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The directory holding `libstrata.so` (the test binary lives in its `deps/`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf()
}

#[test]
fn c_program_uses_the_cpu_side_calls() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    assert!(
        lib.join("libstrata.so").exists(),
        "libstrata.so not found in {}",
        lib.display()
    );
    let dir = std::env::temp_dir().join(format!("strata-c-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join("api_test");
    let out = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(manifest.join("tests/c/api_test.c"))
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-L")
        .arg(&lib)
        .arg("-lstrata")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .output()
        .expect("gcc runs (install gcc)");
    assert!(
        out.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seed: u64 = rand::random::<u64>() >> 1;
    println!("seed {seed}");
    let mut child = Command::new(&exe)
        .arg(seed.to_string())
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    assert!(
        status.success(),
        "api_test failed (seed {seed}):\n{stdout}{stderr}"
    );
    assert!(stdout.contains(" checks"), "api_test printed no summary");
    std::fs::remove_dir_all(&dir).ok();
}
