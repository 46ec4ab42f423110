//! Compares every hand-written struct in `sys` with the C compiler's view of the installed
//! UCX headers: sizes, alignments and field offsets must all agree.

use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

use crate::sys::*;

macro_rules! layout {
    ($out:ident, $c:ident; $( $ty:ident => $cty:literal { $($field:ident),* } )*) => {
        $(
            $out.push((format!("{} size", $cty), size_of::<$ty>()));
            $c.push_str(&format!("printf(\"{} size %zu\\n\", sizeof({}));\n", $cty, $cty));
            $out.push((format!("{} align", $cty), align_of::<$ty>()));
            $c.push_str(&format!("printf(\"{} align %zu\\n\", _Alignof({}));\n", $cty, $cty));
            $(
                $out.push((format!("{}.{}", $cty, stringify!($field)), offset_of!($ty, $field)));
                $c.push_str(&format!(
                    "printf(\"{}.{} %zu\\n\", offsetof({}, {}));\n",
                    $cty, stringify!($field), $cty, stringify!($field)
                ));
            )*
        )*
    };
}

#[test]
fn layout_matches_headers() {
    let mut rust: Vec<(String, usize)> = Vec::new();
    let mut body = String::new();
    layout!(rust, body;
        ucp_params_t => "ucp_params_t" { field_mask, features, request_size, request_init,
            request_cleanup, tag_sender_mask, mt_workers_shared, estimated_num_eps,
            estimated_num_ppn, name }
        ucs_cpu_set_t => "ucs_cpu_set_t" { ucs_bits }
        ucp_worker_params_t => "ucp_worker_params_t" { field_mask, thread_mode, cpu_mask,
            events, user_data, event_fd, flags, name, am_alignment, client_id }
        ucs_sock_addr_t => "ucs_sock_addr_t" { addr, addrlen }
        ucp_listener_params_t => "ucp_listener_params_t" { field_mask, sockaddr,
            accept_handler, conn_handler }
        ucp_listener_attr_t => "ucp_listener_attr_t" { field_mask, sockaddr }
        ucp_err_handler_t => "ucp_err_handler_t" { cb, arg }
        ucp_ep_params_t => "ucp_ep_params_t" { field_mask, address, err_mode, err_handler,
            user_data, flags, sockaddr, conn_request, name, local_sockaddr }
        ucp_request_param_t => "ucp_request_param_t" { op_attr_mask, flags, request, cb,
            datatype, user_data, reply_buffer, memory_type, recv_info, memh }
        ucp_mem_map_params_t => "ucp_mem_map_params_t" { field_mask, address, length, flags,
            prot, memory_type }
        ucp_am_handler_param_t => "ucp_am_handler_param_t" { field_mask, id, flags, cb, arg }
        ucp_am_recv_param_t => "ucp_am_recv_param_t" { recv_attr, reply_ep }
        ucs_status_t => "ucs_status_t" { }
        ucs_memory_type_t => "ucs_memory_type_t" { }
        ucs_thread_mode_t => "ucs_thread_mode_t" { }
        ucp_err_handling_mode_t => "ucp_err_handling_mode_t" { }
    );
    // Enum and flag values the binding relies on.
    for (name, value) in [
        ("UCS_ERR_BUSY", i64::from(UCS_ERR_BUSY)),
        ("UCS_ERR_CANCELED", i64::from(UCS_ERR_CANCELED)),
        (
            "UCS_ERR_CONNECTION_RESET",
            i64::from(UCS_ERR_CONNECTION_RESET),
        ),
        ("UCS_INPROGRESS", i64::from(UCS_INPROGRESS)),
        ("UCS_ERR_LAST", i64::try_from(UCS_ERR_LAST).unwrap()),
        ("UCS_THREAD_MODE_SINGLE", i64::from(UCS_THREAD_MODE_SINGLE)),
        (
            "UCP_ERR_HANDLING_MODE_NONE",
            i64::from(UCP_ERR_HANDLING_MODE_NONE),
        ),
        (
            "UCP_ERR_HANDLING_MODE_PEER",
            i64::from(UCP_ERR_HANDLING_MODE_PEER),
        ),
        ("UCS_MEMORY_TYPE_HOST", i64::from(UCS_MEMORY_TYPE_HOST)),
        ("UCP_FEATURE_RMA", i64::try_from(UCP_FEATURE_RMA).unwrap()),
        (
            "UCP_FEATURE_WAKEUP",
            i64::try_from(UCP_FEATURE_WAKEUP).unwrap(),
        ),
        ("UCP_FEATURE_AM", i64::try_from(UCP_FEATURE_AM).unwrap()),
        (
            "UCP_PARAM_FIELD_MT_WORKERS_SHARED",
            i64::try_from(UCP_PARAM_FIELD_MT_WORKERS_SHARED).unwrap(),
        ),
        (
            "UCP_EP_PARAMS_FLAGS_CLIENT_SERVER",
            i64::from(UCP_EP_PARAMS_FLAGS_CLIENT_SERVER),
        ),
        (
            "UCP_EP_PARAM_FIELD_CONN_REQUEST",
            i64::try_from(UCP_EP_PARAM_FIELD_CONN_REQUEST).unwrap(),
        ),
        (
            "UCP_EP_CLOSE_FLAG_FORCE",
            i64::from(UCP_EP_CLOSE_FLAG_FORCE),
        ),
        (
            "UCP_AM_FLAG_PERSISTENT_DATA",
            i64::from(UCP_AM_FLAG_PERSISTENT_DATA),
        ),
        ("UCP_AM_SEND_FLAG_REPLY", i64::from(UCP_AM_SEND_FLAG_REPLY)),
        (
            "UCP_AM_RECV_ATTR_FLAG_DATA",
            i64::try_from(UCP_AM_RECV_ATTR_FLAG_DATA).unwrap(),
        ),
        (
            "UCP_AM_RECV_ATTR_FLAG_RNDV",
            i64::try_from(UCP_AM_RECV_ATTR_FLAG_RNDV).unwrap(),
        ),
        (
            "UCP_OP_ATTR_FIELD_FLAGS",
            i64::from(UCP_OP_ATTR_FIELD_FLAGS),
        ),
        ("UCP_API_MAJOR", i64::from(UCP_API_MAJOR)),
        ("UCP_API_MINOR", i64::from(UCP_API_MINOR)),
    ] {
        rust.push((name.to_string(), usize::try_from(value + 1000).unwrap()));
        body.push_str(&format!(
            "printf(\"{name} %zu\\n\", (size_t)((long long)({name}) + 1000));\n"
        ));
    }
    let dir = std::env::temp_dir().join(format!("strata-ucx-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layout.c");
    let binary = dir.join("layout");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n#include <stddef.h>\n#include <ucp/api/ucp.h>\nint main(void) {{\n{body}return 0;\n}}\n"
        ),
    )
    .unwrap();
    let compile = Command::new("gcc")
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .output()
        .expect("gcc must be installed to check the UCX declarations (apt-get install gcc)");
    assert!(
        compile.status.success(),
        "compiling the layout probe against <ucp/api/ucp.h> failed (install libucx-dev):\n{}",
        String::from_utf8_lossy(&compile.stderr)
    );
    let run = Command::new(&binary).output().unwrap();
    let text = String::from_utf8(run.stdout).unwrap();
    let c: Vec<(String, usize)> = text
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(c.len(), rust.len());
    let mismatches: Vec<String> = rust
        .iter()
        .zip(&c)
        .filter(|(r, c)| r != c)
        .map(|(r, c)| format!("{}: rust {} vs C {} ({})", r.0, r.1, c.1, c.0))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
    println!(
        "checked {} sizes, offsets and constants against the UCX headers",
        rust.len()
    );
}
