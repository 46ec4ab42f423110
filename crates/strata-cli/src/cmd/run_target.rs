//! What `strata run` checks about the program before starting it: that the dynamic loader
//! will preload `libstrata_run.so` into it. A statically linked program has no loader, and
//! the loader ignores `LD_PRELOAD` for a program that gains privileges (set-user-ID,
//! set-group-ID, file capabilities); either would run with none of its memory paged and no
//! sign of it, so both are refused with the reason.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why the loader will not preload the library into `program`: `None` when it will, or when
/// the program cannot be judged here (not found, a script, unreadable), in which case
/// starting it says what is wrong.
pub fn preload_refusal(program: &OsStr) -> Option<String> {
    let path = resolve(program)?;
    let file = File::open(&path).ok()?;
    let meta = file.metadata().ok()?;
    let (euid, egid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    let shown = path.display();
    if meta.mode() & libc::S_ISUID != 0 && meta.uid() != euid {
        return Some(format!(
            "{shown} is set-user-ID (owner {}): the loader ignores LD_PRELOAD for it, so Strata could not page its memory; run a copy without the set-user-ID bit, or run strata run as its owner",
            meta.uid()
        ));
    }
    if meta.mode() & libc::S_ISGID != 0 && meta.gid() != egid {
        return Some(format!(
            "{shown} is set-group-ID (group {}): the loader ignores LD_PRELOAD for it, so Strata could not page its memory; run a copy without the set-group-ID bit",
            meta.gid()
        ));
    }
    if has_file_capabilities(&path) && euid != 0 {
        return Some(format!(
            "{shown} has file capabilities: the loader ignores LD_PRELOAD for it, so Strata could not page its memory; run it as root or a copy without capabilities"
        ));
    }
    let elf = elf::ElfStream::<elf::endian::AnyEndian, _>::open_stream(file).ok()?;
    let dynamic = elf
        .segments()
        .iter()
        .any(|s| s.p_type == elf::abi::PT_INTERP);
    (!dynamic).then(|| {
        format!(
            "{shown} is statically linked: no dynamic loader runs in it to preload libstrata_run.so, so Strata could not page its memory; run a dynamically linked build of it"
        )
    })
}

/// The file `program` names, found on `PATH` as `execvp` would when it has no slash.
fn resolve(program: &OsStr) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

/// Whether the file carries `security.capability` (what `setcap` writes).
fn has_file_capabilities(path: &Path) -> bool {
    let mut value = [0u8; 64];
    rustix::fs::getxattr(path, "security.capability", &mut value[..]).is_ok_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_programs_pass_and_others_are_judged_by_starting_them() {
        // `sh` on PATH is dynamically linked on every system these tests run on.
        assert_eq!(preload_refusal(OsStr::new("sh")), None);
        // Not found, or not ELF: left to starting it.
        assert_eq!(preload_refusal(OsStr::new("/nonexistent/program")), None);
        assert_eq!(preload_refusal(OsStr::new("strata-no-such-program")), None);
        let dir = std::env::temp_dir().join(format!("strata-run-target-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("script.sh");
        std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(preload_refusal(script.as_os_str()), None);
        // A set-user-ID copy owned by someone else.
        let copy = dir.join("suid-sh");
        std::fs::copy("/bin/sh", &copy).unwrap();
        let owned = std::os::unix::fs::chown(&copy, Some(65534), Some(65534)).is_ok();
        std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o4755))
            .unwrap();
        if owned {
            let why = preload_refusal(copy.as_os_str()).expect("refused");
            assert!(why.contains("set-user-ID"), "{why}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
