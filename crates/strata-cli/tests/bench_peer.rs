//! `strata bench peer` on a machine that shows at most one GPU (CI has none; a GPU machine
//! is narrowed to one with `CUDA_VISIBLE_DEVICES=0`) refuses at once, before any GPU work,
//! saying that a second GPU is needed; malformed `--peer` values are refused by the parser.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn strata(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strata runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("strata {args:?} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn one_gpu_is_refused_with_the_need_for_a_second() {
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map_or_else(std::env::temp_dir, Into::into)
        .join(format!("bench-peer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("peer.json");
    let plot = dir.join("peer");
    for extra in [&[][..], &["--peer", "1:1GiB"][..], &["--check"][..]] {
        let mut args = vec!["bench", "peer", "--quick"];
        args.extend_from_slice(extra);
        let (j, p) = (json.to_str().unwrap(), plot.to_str().unwrap());
        args.extend_from_slice(&["--json", j, "--plot", p]);
        let out = strata(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
        assert!(
            stderr.contains("needs a second GPU"),
            "{args:?}: no clear refusal: {stderr}"
        );
        assert!(!json.exists(), "a refused run wrote a record");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_peers_are_refused_by_the_parser() {
    for bad in ["1", "one:1GiB", "1:much"] {
        let out = strata(&["bench", "peer", "--peer", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--peer {bad}: {stderr}");
        assert!(stderr.contains("--peer"), "--peer {bad}: {stderr}");
    }
}
