//! The UCX settings of a node and of a client, and how much memory a client's UCX queues
//! take ([`UcxFootprint`]).
//!
//! Why a client may want small queues: `strata run` loads the client into the program it
//! pages, so the client's queues count against the program's memory limit like any other
//! memory it has (a memory cgroup charges the shared-memory segments the client maps and
//! the pages of the node's segments it writes first). With UCX 1.13's defaults plus the
//! 1024-entry FIFOs used before, a client of a node on the same host held 19-25 MiB of
//! shared memory per connection, and `strata run` opens one connection per chunk it borrows
//! (37-56 MiB for sort and NumPy at 32 MiB, `strata bench run`, session 8): more than the
//! limit the program was to run in. The node's own queues are charged to the node.
//!
//! What takes the memory, measured with `strata run --memory 32MiB` over a node on this
//! host in a memory cgroup without a limit (shared memory the cgroup charges, per program;
//! sort of 32 MiB of lines, the NumPy sort of 32 MiB, `stress-ng --vm` of 32 MiB, which maps
//! 2.2 MiB of its own):
//!
//! | node / client settings | sort | NumPy | stress-ng |
//! | --- | --- | --- | --- |
//! | FIFO 1024, posix and sysv (before) | 37.1 MiB | 55.7 MiB | 20.7 MiB |
//! | FIFO 1024, client without sysv, 32-descriptor growth | 17.3 MiB | 25.9 MiB | 10.8 MiB |
//! | FIFO 128, posix and sysv | 12.8 MiB | 18.4 MiB | 8.3 MiB |
//! | FIFO 128, client without sysv, 32-descriptor growth ([`UcxFootprint::Lean`]) | 2.6 MiB | 3.9 MiB | 3.5 MiB |
//! | client over TCP only | 0 | 0 | 2.2 MiB |
//!
//! Each shared-memory transport a worker opens (`posix`, `sysv`) has its own receive FIFO
//! and a pool of 8 KiB receive descriptors, one per FIFO entry, grown 512 at a time by
//! default; a sender writes its fragments into the receiver's descriptors. So the FIFO size
//! bounds what both ends hold, and it has to be the same at both ends (a client with 64
//! entries and a node with 1024 hung at the first request), which is why it is a setting of
//! both ends and part of the handshake version. The transports a client
//! opens and its descriptors' growth are its own affair.
//!
//! TCP alone needs no shared memory, but its round trips cost: sort over a node at a 24 MiB
//! budget took 88 s over TCP against 32-39 s over shared memory with either FIFO size
//! (single runs on the shared 2-core VM). A FIFO of 128 entries holds 16 pages of 64 KiB in
//! flight; `strata bench remote` read 32 x 2 pages in flight at 2.7-3.4 GB/s with 64, 128,
//! 256 and 1024 entries alike (runs vary 3x on this VM).

use std::str::FromStr;

/// Entries of each shared-memory FIFO, at both ends (UCX's `MM_FIFO_SIZE`; UCX's own default
/// is 64). Both ends must use the same size: see the module docs.
pub const FIFO_ENTRIES: u32 = 128;

/// Receive descriptors a lean client's shared-memory pool grows by (UCX's
/// `MM_RX_BUFS_GROW`, default 512): its FIFO needs [`FIFO_ENTRIES`] of them, and growing by
/// 512 leaves hundreds of 8 KiB descriptors mapped that are never used.
pub const LEAN_RX_GROWTH: u32 = 32;

/// Transports a lean client leaves out when no list is given: `sysv`, a second
/// shared-memory transport with queues of its own, and `cma`, which serves only rendezvous
/// transfers that clients and nodes never use.
pub const LEAN_LEAVES_OUT: &str = "^sysv,cma";

/// Environment variable that chooses a client's footprint (`lean` or `standard`);
/// `strata run` sets `lean` unless it is set.
pub const FOOTPRINT_VAR: &str = "STRATA_UCX_FOOTPRINT";

/// How much memory a client's UCX queues may take. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UcxFootprint {
    /// UCX's choice of transports and pool growth (a node always uses this).
    #[default]
    Standard,
    /// One shared-memory transport (`posix`), no `cma`, receive pools grown
    /// [`LEAN_RX_GROWTH`] descriptors at a time: for a client inside a program held to a
    /// memory limit (`strata run`).
    Lean,
}

impl FromStr for UcxFootprint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "standard" => Ok(Self::Standard),
            "lean" => Ok(Self::Lean),
            _ => Err(format!(
                "{FOOTPRINT_VAR}={s:?} not understood; write lean (small UCX queues, for programs held to a memory limit) or standard"
            )),
        }
    }
}

impl UcxFootprint {
    /// The footprint [`FOOTPRINT_VAR`] names; [`UcxFootprint::Standard`] when it is unset.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(FOOTPRINT_VAR) {
            Ok(value) => value.parse(),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!(
                "{FOOTPRINT_VAR} is not valid text; write lean or standard"
            )),
        }
    }
}

/// What a UCX context is created with: its transport list (`None`: UCX's choice) and further
/// settings (names without the `UCX_` prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UcxConfig {
    /// UCX's `TLS` setting.
    pub transports: Option<String>,
    /// Further settings.
    pub settings: Vec<(String, String)>,
}

/// The UCX configuration of an end asked for `transports` (`None`: UCX's choice) with
/// `footprint`, where `is_set` tells whether a `UCX_*` environment variable is set: a
/// setting the environment makes is left to it (the user's `UCX_*` variables win), and a
/// setting for a transport that cannot open is left out (UCX warns about settings it never
/// uses).
pub fn ucx_config(
    transports: Option<&str>,
    footprint: UcxFootprint,
    is_set: impl Fn(&str) -> bool,
) -> UcxConfig {
    let set = |names: &[&str]| names.iter().any(|name| is_set(name));
    // A lean client names the transports only where neither the caller nor UCX_TLS did.
    let transports = match (transports, footprint) {
        (None, UcxFootprint::Lean) if !is_set("UCX_TLS") => Some(LEAN_LEAVES_OUT.to_string()),
        (given, _) => given.map(str::to_string),
    };
    let mut settings = Vec::new();
    if shared_memory_may_open(transports.as_deref()) {
        if !set(&[
            "UCX_MM_FIFO_SIZE",
            "UCX_SYSV_FIFO_SIZE",
            "UCX_POSIX_FIFO_SIZE",
        ]) {
            settings.push(("MM_FIFO_SIZE".into(), FIFO_ENTRIES.to_string()));
        }
        if footprint == UcxFootprint::Lean
            && !set(&[
                "UCX_MM_RX_BUFS_GROW",
                "UCX_SYSV_RX_BUFS_GROW",
                "UCX_POSIX_RX_BUFS_GROW",
            ])
        {
            settings.push(("MM_RX_BUFS_GROW".into(), LEAN_RX_GROWTH.to_string()));
        }
    }
    UcxConfig {
        transports,
        settings,
    }
}

/// Whether a context with this transport list may open a shared-memory transport (`None`:
/// UCX's choice, which includes them; a list starting with `^` names those left out).
fn shared_memory_may_open(transports: Option<&str>) -> bool {
    transports.is_none_or(|list| {
        let list = list.trim_start();
        match list.strip_prefix('^') {
            Some(left_out) => {
                !["posix", "sysv"]
                    .iter()
                    .all(|t| left_out.split(',').any(|n| n.trim() == *t))
                    && !left_out
                        .split(',')
                        .any(|n| matches!(n.trim(), "sm" | "shm" | "mm"))
            }
            None => list
                .split(',')
                .any(|name| matches!(name.trim(), "all" | "sm" | "shm" | "mm" | "posix" | "sysv")),
        }
    })
}

/// Whether the `UCX_*` variable `name` is set in this process's environment.
pub(crate) fn env_is_set(name: &str) -> bool {
    std::env::var_os(name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value<'a>(config: &'a UcxConfig, name: &str) -> Option<&'a str> {
        config
            .settings
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    const NOTHING_SET: fn(&str) -> bool = |_| false;

    #[test]
    fn the_fifo_setting_goes_only_where_shared_memory_may_open() {
        let fifo = |t: Option<&str>| {
            value(
                &ucx_config(t, UcxFootprint::Standard, NOTHING_SET),
                "MM_FIFO_SIZE",
            )
            .map(str::to_string)
        };
        let entries = Some(FIFO_ENTRIES.to_string());
        assert_eq!(fifo(None), entries);
        assert_eq!(fifo(Some("posix,sysv")), entries);
        assert_eq!(fifo(Some("tcp, sm")), entries);
        assert_eq!(fifo(Some("^cma")), entries);
        assert_eq!(fifo(Some("^sysv")), entries, "posix still opens");
        assert_eq!(fifo(Some(" ^ posix, sysv")), None);
        assert_eq!(fifo(Some("^sysv,posix,cma")), None);
        assert_eq!(fifo(Some("^mm")), None);
        assert_eq!(fifo(Some("tcp")), None);
        assert_eq!(fifo(Some("rc_x,ud_x")), None);
    }

    #[test]
    fn a_lean_client_opens_one_shared_memory_transport_with_small_pools() {
        let lean = ucx_config(None, UcxFootprint::Lean, NOTHING_SET);
        assert_eq!(lean.transports.as_deref(), Some(LEAN_LEAVES_OUT));
        assert_eq!(
            value(&lean, "MM_RX_BUFS_GROW"),
            Some(LEAN_RX_GROWTH.to_string().as_str())
        );
        assert_eq!(
            value(&lean, "MM_FIFO_SIZE"),
            Some(FIFO_ENTRIES.to_string().as_str()),
            "the FIFO is the same at both ends"
        );
        // A node, or a standard client, keeps UCX's transports and pools.
        let standard = ucx_config(None, UcxFootprint::Standard, NOTHING_SET);
        assert_eq!(standard.transports, None);
        assert_eq!(value(&standard, "MM_RX_BUFS_GROW"), None);
        // Transports the caller names are kept, lean or not; over TCP alone there is no
        // shared-memory pool to size.
        let tcp = ucx_config(Some("tcp"), UcxFootprint::Lean, NOTHING_SET);
        assert_eq!(tcp.transports.as_deref(), Some("tcp"));
        assert!(tcp.settings.is_empty(), "{tcp:?}");
        let shm = ucx_config(Some("posix,sysv"), UcxFootprint::Lean, NOTHING_SET);
        assert_eq!(shm.transports.as_deref(), Some("posix,sysv"));
        assert!(value(&shm, "MM_RX_BUFS_GROW").is_some());
    }

    #[test]
    fn the_users_ucx_environment_wins() {
        let only = |set: &'static [&'static str]| move |name: &str| set.contains(&name);
        let c = ucx_config(None, UcxFootprint::Lean, only(&["UCX_TLS"]));
        assert_eq!(c.transports, None, "UCX_TLS chooses the transports");
        assert!(value(&c, "MM_RX_BUFS_GROW").is_some());
        for fifo in [
            "UCX_MM_FIFO_SIZE",
            "UCX_SYSV_FIFO_SIZE",
            "UCX_POSIX_FIFO_SIZE",
        ] {
            let set = [fifo];
            let c = ucx_config(None, UcxFootprint::Lean, |n: &str| set.contains(&n));
            assert_eq!(value(&c, "MM_FIFO_SIZE"), None, "{fifo}");
            assert!(value(&c, "MM_RX_BUFS_GROW").is_some(), "{fifo}");
            assert_eq!(c.transports.as_deref(), Some(LEAN_LEAVES_OUT));
        }
        let c = ucx_config(None, UcxFootprint::Lean, only(&["UCX_POSIX_RX_BUFS_GROW"]));
        assert_eq!(value(&c, "MM_RX_BUFS_GROW"), None);
        assert!(value(&c, "MM_FIFO_SIZE").is_some());
    }

    #[test]
    fn footprints_parse_and_bad_ones_say_what_to_write() {
        assert_eq!("lean".parse(), Ok(UcxFootprint::Lean));
        assert_eq!(" standard\n".parse(), Ok(UcxFootprint::Standard));
        for bad in ["", "Lean", "small", "lean,standard"] {
            let e = bad.parse::<UcxFootprint>().unwrap_err();
            assert!(e.contains(FOOTPRINT_VAR) && e.contains("lean"), "{e}");
        }
    }
}
