//! Links `librdmacm.so` as a drop-in `librdmacm.so.1`:
//!
//! 1. SONAME `librdmacm.so.1`, NEEDED `libibverbs.so.1` (linked against the system's
//!    development symlink, as rdma-core's librdmacm is).
//! 2. Symbol versions: `exports.txt` (the names and versions rdma-core 44 exports) becomes
//!    a version script plus `global_asm!` trampolines (`softhca-cabi-build`).
//! 3. Layout check: a C program built against the system `<rdma/rdma_cma.h>` prints
//!    `sizeof`/`offsetof`/`alignof` of every struct and field mirrored in `src/abi.rs`, as
//!    Rust `const` assertions; a mismatch fails the build.
//! 4. `c/verbs_inline.c`: the verbs the header defines `static inline` (`ibv_post_send`,
//!    `ibv_poll_cq`, `ibv_create_qp_ex`, ...), compiled against the system header.

use std::path::{Path, PathBuf};

use softhca_cabi_build::{self as cabi, Layout};

const NODES: &[&str] = &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"];

const LAYOUTS: &[Layout] = &[
    (
        "ibv_sa_path_rec",
        "struct ibv_sa_path_rec",
        &[
            ("dgid", ""),
            ("sgid", ""),
            ("dlid", ""),
            ("slid", ""),
            ("raw_traffic", ""),
            ("flow_label", ""),
            ("hop_limit", ""),
            ("traffic_class", ""),
            ("reversible", ""),
            ("numb_path", ""),
            ("pkey", ""),
            ("sl", ""),
            ("mtu_selector", ""),
            ("mtu", ""),
            ("rate_selector", ""),
            ("rate", ""),
            ("packet_life_time_selector", ""),
            ("packet_life_time", ""),
            ("preference", ""),
        ],
    ),
    (
        "rdma_ib_addr",
        "struct rdma_ib_addr",
        &[("sgid", ""), ("dgid", ""), ("pkey", "")],
    ),
    (
        "rdma_addr",
        "struct rdma_addr",
        &[
            ("src_storage", ""),
            ("dst_storage", ""),
            ("ibaddr", "addr.ibaddr"),
        ],
    ),
    (
        "rdma_route",
        "struct rdma_route",
        &[("addr", ""), ("path_rec", ""), ("num_paths", "")],
    ),
    (
        "rdma_event_channel",
        "struct rdma_event_channel",
        &[("fd", "")],
    ),
    (
        "rdma_cm_id",
        "struct rdma_cm_id",
        &[
            ("verbs", ""),
            ("channel", ""),
            ("context", ""),
            ("qp", ""),
            ("route", ""),
            ("ps", ""),
            ("port_num", ""),
            ("event", ""),
            ("send_cq_channel", ""),
            ("send_cq", ""),
            ("recv_cq_channel", ""),
            ("recv_cq", ""),
            ("srq", ""),
            ("pd", ""),
            ("qp_type", ""),
        ],
    ),
    (
        "rdma_conn_param",
        "struct rdma_conn_param",
        &[
            ("private_data", ""),
            ("private_data_len", ""),
            ("responder_resources", ""),
            ("initiator_depth", ""),
            ("flow_control", ""),
            ("retry_count", ""),
            ("rnr_retry_count", ""),
            ("srq", ""),
            ("qp_num", ""),
        ],
    ),
    (
        "rdma_ud_param",
        "struct rdma_ud_param",
        &[
            ("private_data", ""),
            ("private_data_len", ""),
            ("ah_attr", ""),
            ("qp_num", ""),
            ("qkey", ""),
        ],
    ),
    (
        "rdma_cm_join_mc_attr_ex",
        "struct rdma_cm_join_mc_attr_ex",
        &[("comp_mask", ""), ("join_flags", ""), ("addr", "")],
    ),
    (
        "rdma_cm_event",
        "struct rdma_cm_event",
        &[
            ("id", ""),
            ("listen_id", ""),
            ("event", ""),
            ("status", ""),
            ("param", ""),
        ],
    ),
    (
        "rdma_addrinfo",
        "struct rdma_addrinfo",
        &[
            ("ai_flags", ""),
            ("ai_family", ""),
            ("ai_qp_type", ""),
            ("ai_port_space", ""),
            ("ai_src_len", ""),
            ("ai_dst_len", ""),
            ("ai_src_addr", ""),
            ("ai_dst_addr", ""),
            ("ai_src_canonname", ""),
            ("ai_dst_canonname", ""),
            ("ai_route_len", ""),
            ("ai_route", ""),
            ("ai_connect_len", ""),
            ("ai_connect", ""),
            ("ai_next", ""),
        ],
    ),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=exports.txt");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=c/verbs_inline.c");
    println!("cargo:rerun-if-changed=/usr/include/rdma/rdma_cma.h");
    println!("cargo:rerun-if-changed=/usr/include/rdma");

    let exports = cabi::parse_exports(
        &std::fs::read_to_string(manifest.join("exports.txt")).expect("read exports.txt"),
        NODES,
    );
    let map = out.join("librdmacm.map");
    std::fs::write(&map, cabi::version_script(NODES, &exports)).expect("write version script");
    std::fs::write(
        out.join("exports.rs"),
        cabi::exports_asm(&exports, "crate::api", "__softhca_rdmacm_alias_"),
    )
    .expect("write exports.rs");

    let probe = cabi::layout_probe_source(&["rdma/rdma_cma.h"], "crate::abi", LAYOUTS);
    let checked = match cabi::layout_asserts(
        &out,
        "softhca-rdmacm",
        Path::new("/usr/include/rdma/rdma_cma.h"),
        "librdmacm-dev",
        &probe,
    ) {
        Some(asserts) => {
            std::fs::write(out.join("layout_check.rs"), asserts).expect("write layout_check.rs");
            true
        }
        None => {
            std::fs::write(out.join("layout_check.rs"), "// rdma_cma.h not found\n")
                .expect("write layout_check.rs");
            false
        }
    };
    println!(
        "cargo:rustc-env=SOFTHCA_RDMACM_LAYOUT_CHECKED={}",
        u8::from(checked)
    );

    cc::Build::new()
        .file(manifest.join("c/verbs_inline.c"))
        .warnings(true)
        .compile("softhca_rdmacm_verbs_inline");
    println!("cargo:rustc-link-lib=dylib=ibverbs");

    cabi::link_so_1(&out, "softhca-rdmacm", "librdmacm.so", "librdmacm.so.1");

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
