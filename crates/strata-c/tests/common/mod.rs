//! What the C-program tests share: finding the `libstrata.so` of this build, compiling a C
//! program under `tests/c/` with gcc, and running it with a fresh seed and a deadline.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the `libstrata.so` cargo built for this test run: `deps/` beside the
/// test binary (where `cargo test` leaves it) or the profile directory (after `cargo build`).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [deps, deps.parent().expect("target/<profile>")]
        .into_iter()
        .find(|d| d.join("libstrata.so").exists())
        .expect("cargo builds libstrata.so for this test run")
        .to_path_buf()
}

/// This crate's directory.
pub fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh temporary directory for test `tag` of this process.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-c-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// gcc flags that build against this build's header and library, found through the rpath.
pub fn direct_flags() -> Vec<String> {
    let lib = lib_dir();
    vec![
        format!("-I{}", manifest().join("include").display()),
        format!("-L{}", lib.display()),
        "-lstrata".to_string(),
        format!("-Wl,-rpath,{}", lib.display()),
    ]
}

/// Compiles `tests/c/<name>.c` with `flags` into `dir/<name>`.
pub fn compile(name: &str, dir: &Path, flags: &[String]) -> PathBuf {
    let exe = dir.join(name);
    let out = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(manifest().join(format!("tests/c/{name}.c")))
        .args(flags)
        .output()
        .expect("gcc runs (install gcc)");
    assert!(
        out.status.success(),
        "gcc {flags:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `exe SEED ARGS...` with a fresh seed and a 60 s deadline, and checks that it succeeded
/// and printed its summary (" checks"). `rpath_only`: the library is the one the program was
/// linked with (through its rpath), not an older one in another target directory that
/// cargo's `LD_LIBRARY_PATH` may name first.
pub fn run_checked(exe: &Path, args: &[&std::ffi::OsStr], rpath_only: bool) {
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let seed: u64 = rand::random::<u64>() >> 1;
    println!("seed {seed}");
    let mut cmd = Command::new(exe);
    if rpath_only {
        cmd.env_remove("LD_LIBRARY_PATH");
    }
    let mut child = cmd
        .arg(seed.to_string())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("{name} did not finish in 60 s (seed {seed})");
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
    assert!(status.success(), "{name} failed (seed {seed}):\n{text}");
    assert!(text.contains(" checks"), "{name} printed no summary");
}
