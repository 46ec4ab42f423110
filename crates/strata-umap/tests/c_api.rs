//! Builds `tests/c/umap_test.c` with gcc against `include/umap.h` and the freshly built
//! `libstrata_umap.so`, and runs it: the C API as a Umap program uses it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

fn skip_or_fail(why: &str) {
    assert!(!in_ci(), "the C API test cannot run in CI: {why}");
    eprintln!("SKIPPED c_api: {why}; CI fails instead");
}

/// The cdylib cargo built for this test run (next to the test binary or one level up).
fn cdylib_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [deps, deps.parent()?]
        .into_iter()
        .find(|d| d.join("libstrata_umap.so").exists())
        .map(Path::to_path_buf)
}

#[test]
fn c_program_uses_the_umap_api() {
    if let Err(e) = strata_pager::probe::probe() {
        return skip_or_fail(&format!("userfaultfd unavailable: {e}"));
    }
    let Some(lib_dir) = cdylib_dir() else {
        return skip_or_fail("libstrata_umap.so was not built next to the test binary");
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let work = std::env::temp_dir().join(format!("strata-umap-c-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let exe = work.join("umap_test");
    let gcc = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c/umap_test.c"))
        .arg("-L")
        .arg(&lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-lstrata_umap", "-lpthread", "-o"])
        .arg(&exe)
        .output();
    let gcc = match gcc {
        Ok(out) => out,
        Err(e) => return skip_or_fail(&format!("gcc not runnable: {e}")),
    };
    assert!(
        gcc.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&gcc.stderr)
    );
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(7);
    eprintln!("c_api: seed {seed}");
    let run = Command::new(&exe)
        .env("UMAP_PAGESIZE", "16384")
        .env("UMAP_BUFSIZE", "16")
        .env("UMAP_PAGE_FILLERS", "2")
        .env("UMAP_PAGE_EVICTORS", "1")
        .env("UMAP_READ_AHEAD", "2")
        .env("UMAP_TEST_SEED", seed.to_string())
        .env("UMAP_TEST_DIR", &work)
        .output()
        .expect("runs the C test");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success() && stdout.contains("OK"),
        "C test failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
    // An invalid variable makes umap() fail with a message instead of being ignored.
    let bad = Command::new(&exe)
        .env("UMAP_PAGESIZE", "16384")
        .env("UMAP_BUFSIZE", "16")
        .env("UMAP_PAGE_FILLERS", "2")
        .env("UMAP_PAGE_EVICTORS", "0")
        .env("UMAP_TEST_DIR", &work)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "UMAP_PAGE_EVICTORS=0 must not pass");
    assert!(stderr.contains("UMAP_PAGE_EVICTORS"), "{stderr}");
    std::fs::remove_dir_all(&work).unwrap();
}
