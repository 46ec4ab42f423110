//! Builds `examples/umap_file.c` (the C example of the README) with gcc against
//! `include/umap.h` and the freshly built `libstrata_umap.so`, and runs it, so the example
//! cannot rot.

use std::path::Path;
use std::process::Command;

#[test]
fn c_example_builds_and_runs() {
    let in_ci = std::env::var_os("CI").is_some();
    if let Err(e) = strata_pager::probe::probe() {
        assert!(!in_ci, "userfaultfd unavailable in CI: {e}");
        return eprintln!("SKIPPED: userfaultfd unavailable: {e}");
    }
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let Some(lib_dir) = [deps, deps.parent().unwrap()]
        .into_iter()
        .find(|d| d.join("libstrata_umap.so").exists())
    else {
        assert!(
            !in_ci,
            "libstrata_umap.so was not built next to the test binary"
        );
        return eprintln!("SKIPPED: libstrata_umap.so not built");
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let work = std::env::temp_dir().join(format!("strata-umap-example-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let bin = work.join("umap_file");
    let gcc = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/umap_file.c"))
        .arg("-L")
        .arg(lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-lstrata_umap", "-lpthread", "-o"])
        .arg(&bin)
        .output()
        .expect("gcc runs");
    assert!(
        gcc.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&gcc.stderr)
    );
    let run = Command::new(&bin)
        .arg(work.join("data.bin"))
        .env("UMAP_PAGESIZE", "65536")
        .env("UMAP_BUFSIZE", "64")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("the file holds them"),
        "example failed ({}):\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::remove_dir_all(&work).unwrap();
}
