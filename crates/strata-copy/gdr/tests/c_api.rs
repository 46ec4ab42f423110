//! The C header compiles, a C program links against libstrata_gdr.so and passes its checks
//! (ABI layout, bad arguments; with a GPU also pin/map/copy validation); a direct access
//! through a shadow mapping dies with SIGSEGV and a message, in a child process.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn deps_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn run_with_deadline(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn c_program_builds_links_and_passes() {
    let deps = deps_dir();
    let lib_dir = [deps.clone(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .find(|d| d.join("libstrata_gdr.so").exists())
        .expect("libstrata_gdr.so not built next to the test binary");
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gdr_program");
    let cc = run_with_deadline(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
            .arg(manifest.join("include"))
            .arg(manifest.join("tests/gdr_program.c"))
            .arg("-o")
            .arg(&out)
            .arg("-L")
            .arg(&lib_dir)
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
            .args(["-lstrata_gdr", "-ldl"]),
        Duration::from_secs(60),
    );
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let run = run_with_deadline(
        Command::new(&out).arg(seed.to_string()),
        Duration::from_secs(120),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    eprintln!("{text}");
    assert!(run.status.success(), "gdr_program failed:\n{text}");
}

#[test]
fn direct_access_to_a_shadow_faults_loudly() {
    if std::env::var_os("GDR_SHADOW_TEST_CHILD").is_some() {
        let s = strata_gdr::shadow::Shadow::new(8192).unwrap();
        assert!(strata_gdr::shadow::contains(s.ptr() as usize + 100));
        // SAFETY: deliberately touches a PROT_NONE page: the process must die with SIGSEGV.
        unsafe { s.ptr().add(100).write_volatile(1) };
        std::process::exit(0); // Not reached when the fault works.
    }
    let run = run_with_deadline(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "direct_access_to_a_shadow_faults_loudly",
                "--nocapture",
            ])
            .env("GDR_SHADOW_TEST_CHILD", "1"),
        Duration::from_secs(30),
    );
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        run.status.signal(),
        Some(libc::SIGSEGV),
        "child status {:?}\n{stderr}",
        run.status
    );
    assert!(
        stderr.contains("direct CPU load/store through a gdr_map() pointer"),
        "{stderr}"
    );
    assert!(stderr.contains("gdr_copy_to_mapping"), "{stderr}");
}
