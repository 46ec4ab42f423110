//! A variable that is not UTF-8 must never panic Strata's environment scan (it did: the scan
//! used `std::env::vars`, so any such variable, Strata's or not, panicked `strata serve`).
//! Setting the environment of a running multi-threaded test is unsound, so each case runs
//! this test binary again as a child with the environment prepared.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::time::{Duration, Instant};

use strata_core::config::{PagerConfig, StoreConfig};

/// Set in the child's environment to run [`child_scans_the_environment`] for real.
const CHILD: &str = "CORE_ENV_TEST_CHILD";

/// The child's side: reads the environment through two builders and prints the outcome.
#[test]
fn child_scans_the_environment() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let pager = PagerConfig::builder().with_env().map(|b| b.build());
    let store = StoreConfig::builder().with_env().map(|b| b.build());
    match (pager, store) {
        (Ok(Ok(p)), Ok(Ok(_))) => println!("CHILD-OK fillers={}", p.fillers),
        (Err(e), _) | (_, Err(e)) | (Ok(Err(e)), _) | (_, Ok(Err(e))) => {
            println!("CHILD-ERR {e}");
        }
    }
}

/// Runs the child with extra variables (raw bytes); returns its stdout. Bounded in time.
fn run_child(vars: &[(&[u8], &[u8])]) -> String {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_scans_the_environment", "--nocapture"])
        .env(CHILD, "1");
    for (name, value) in vars {
        command.env(OsStr::from_bytes(name), OsStr::from_bytes(value));
    }
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the child did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child failed ({}): {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn foreign_variables_that_are_not_utf8_are_ignored() {
    let out = run_child(&[
        (b"CORE_TEST_LATIN1_PATH", b"/data/caf\xe9"),
        (b"CORE_TEST_\xff_NAME", b"1"),
        (b"STRATA_FILLERS", b"3"),
    ]);
    assert!(out.contains("CHILD-OK fillers=3"), "{out}");
}

#[test]
fn strata_variables_that_are_not_utf8_are_clear_errors() {
    let out = run_child(&[(b"STRATA_STORE", b"file:/data/caf\xe9")]);
    assert!(
        out.contains("CHILD-ERR environment variable STRATA_STORE has a value that is not UTF-8"),
        "{out}"
    );
    assert!(out.contains("set it again in UTF-8, or unset it"), "{out}");
    let out = run_child(&[(b"STRATA_\xffILLERS", b"2")]);
    assert!(out.contains("has a name that is not UTF-8"), "{out}");
}
