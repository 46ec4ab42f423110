//! A benchmark stopped by SIGTERM leaves neither its data file nor its memory cgroup behind:
//! `strata bench pager` is started on a fresh directory, stopped once its data file exists,
//! and the directory must be empty afterwards, with the exit status 128 + SIGTERM.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sigterm_removes_the_data_file_and_the_cgroup() {
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map_or_else(std::env::temp_dir, Into::into)
        .join(format!("bench-cleanup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench", "pager", "--size", "512MiB", "--limit", "16MiB", "--repeat", "9",
        ])
        .arg("--dir")
        .arg(&dir)
        .arg("--json")
        .arg(dir.join("out.json"))
        .arg("--svg")
        .arg(dir.join("out.svg"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strata runs");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !entries(&dir)
        .iter()
        .any(|n| n.starts_with("strata-bench-pager-"))
    {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!(
                "the benchmark never wrote its data file in {}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the benchmark did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "exit status after SIGTERM: {status}"
    );
    let left = entries(&dir);
    assert!(
        left.is_empty(),
        "left behind in {}: {left:?}",
        dir.display()
    );
    let cgroup_name = format!("strata-bench-{pid}");
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in own.lines() {
        let path = line
            .rsplit(':')
            .next()
            .unwrap_or("/")
            .trim_start_matches('/');
        for root in [
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/unified",
        ] {
            let candidate = Path::new(root).join(path).join(&cgroup_name);
            assert!(
                !candidate.exists(),
                "cgroup {} left behind",
                candidate.display()
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
