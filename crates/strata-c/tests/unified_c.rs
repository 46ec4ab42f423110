//! Builds `tests/c/unified_test.c` with gcc against `include/strata.h` and `libstrata.so` and
//! runs its CPU-only part (bad input, bad handles: codes and messages, no GPU needed) with a
//! fresh seed and a deadline. The GPU part runs on GPU machines (crates/strata-unified/gpu-check.sh).

mod common;
use common::{compile, direct_flags, run_checked, temp_dir};

#[test]
fn c_program_gets_codes_and_messages_for_bad_unified_calls() {
    let dir = temp_dir("unified");
    let exe = compile("unified_test", &dir, &direct_flags());
    run_checked(&exe, &[std::ffi::OsStr::new("cpu")], true);
    std::fs::remove_dir_all(&dir).ok();
}
