//! Builds `tests/c/unified_test.c` with gcc against `include/strata.h` and `libstrata.so` and
//! runs its CPU-only part (bad input, bad handles: codes and messages, no GPU needed) with a
//! fresh seed and a deadline. The GPU part runs on GPU machines (crates/strata-unified/gpu-check.sh).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [deps, deps.parent().expect("target/<profile>")]
        .into_iter()
        .find(|d| d.join("libstrata.so").exists())
        .expect("cargo builds libstrata.so for this test run")
        .to_path_buf()
}

#[test]
fn c_program_gets_codes_and_messages_for_bad_unified_calls() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let dir = std::env::temp_dir().join(format!("strata-c-unified-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join("unified_test");
    let out = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(manifest.join("tests/c/unified_test.c"))
        .arg(format!("-I{}", manifest.join("include").display()))
        .arg(format!("-L{}", lib.display()))
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
        // The library gcc linked (found through the rpath), not an older one in another
        // target directory that cargo's LD_LIBRARY_PATH may name first.
        .env_remove("LD_LIBRARY_PATH")
        .arg(seed.to_string())
        .arg("cpu")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run unified_test");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("unified_test did not finish in 60 s (seed {seed})");
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
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        status.success(),
        "unified_test failed (seed {seed}):\n{text}"
    );
    assert!(text.contains(" checks"), "unified_test printed no summary");
}
