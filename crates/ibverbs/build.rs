//! Links `libibverbs.so` as a drop-in `libibverbs.so.1`:
//!
//! 1. SONAME `libibverbs.so.1`.
//! 2. Symbol versions: `exports.txt` (the names and versions rdma-core 44 exports) becomes
//!    a version script plus `global_asm!` aliases. Rust's own exports are unversioned, so
//!    every C symbol is defined in assembly as an alias of a mangled Rust function; symbols
//!    exported under two versions (e.g. `ibv_get_device_list@IBVERBS_1.0` and
//!    `@@IBVERBS_1.1`) get `.symver` directives.
//! 3. Layout check: a C program built against the system `<infiniband/verbs.h>` prints
//!    `sizeof`/`offsetof`/`alignof` of every struct and field we mirror, as Rust `const`
//!    assertions; a mismatch fails the build. Skipped (with a warning) when the header is
//!    not installed (`apt-get install libibverbs-dev`).
//!
//! The machinery is shared with librdmacm in `softhca-cabi-build`.

use std::path::{Path, PathBuf};

use softhca_cabi_build::{self as cabi, Layout};

const NODES: &[&str] = &[
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
    "IBVERBS_PRIVATE_34",
    "SOFTHCA_PRIVATE_1",
];

const LAYOUTS: &[Layout] = &[
    ("ibv_gid", "union ibv_gid", &[("raw", "")]),
    (
        "ibv_device",
        "struct ibv_device",
        &[
            ("_ops", ""),
            ("node_type", ""),
            ("transport_type", ""),
            ("name", ""),
            ("dev_name", ""),
            ("dev_path", ""),
            ("ibdev_path", ""),
        ],
    ),
    (
        "ibv_context_ops",
        "struct ibv_context_ops",
        &[
            ("_compat_query_device", ""),
            ("alloc_mw", ""),
            ("bind_mw", ""),
            ("dealloc_mw", ""),
            ("poll_cq", ""),
            ("req_notify_cq", ""),
            ("post_srq_recv", ""),
            ("post_send", ""),
            ("post_recv", ""),
            ("_compat_async_event", ""),
        ],
    ),
    (
        "ibv_context",
        "struct ibv_context",
        &[
            ("device", ""),
            ("ops", ""),
            ("cmd_fd", ""),
            ("async_fd", ""),
            ("num_comp_vectors", ""),
            ("mutex", ""),
            ("abi_compat", ""),
        ],
    ),
    (
        "verbs_context",
        "struct verbs_context",
        &[
            ("query_port", ""),
            ("advise_mr", ""),
            ("alloc_null_mr", ""),
            ("modify_cq", ""),
            ("query_rt_values", ""),
            ("create_cq_ex", ""),
            ("priv_", "priv"),
            ("query_device_ex", ""),
            ("open_qp", ""),
            ("create_qp_ex", ""),
            ("get_srq_num", ""),
            ("create_srq_ex", ""),
            ("open_xrcd", ""),
            ("close_xrcd", ""),
            ("_abi_placeholder3", "_ABI_placeholder3"),
            ("sz", ""),
            ("context", ""),
        ],
    ),
    (
        "ibv_device_attr",
        "struct ibv_device_attr",
        &[
            ("fw_ver", ""),
            ("node_guid", ""),
            ("sys_image_guid", ""),
            ("max_mr_size", ""),
            ("page_size_cap", ""),
            ("vendor_id", ""),
            ("hw_ver", ""),
            ("max_qp", ""),
            ("device_cap_flags", ""),
            ("max_cqe", ""),
            ("max_qp_init_rd_atom", ""),
            ("atomic_cap", ""),
            ("max_ah", ""),
            ("max_srq_sge", ""),
            ("max_pkeys", ""),
            ("local_ca_ack_delay", ""),
            ("phys_port_cnt", ""),
        ],
    ),
    (
        "ibv_device_attr_ex",
        "struct ibv_device_attr_ex",
        &[
            ("orig_attr", ""),
            ("comp_mask", ""),
            ("odp_caps", ""),
            ("completion_timestamp_mask", ""),
            ("hca_core_clock", ""),
            ("device_cap_flags_ex", ""),
            ("tso_caps", ""),
            ("rss_caps", ""),
            ("max_wq_type_rq", ""),
            ("packet_pacing_caps", ""),
            ("raw_packet_caps", ""),
            ("tm_caps", ""),
            ("cq_mod_caps", ""),
            ("max_dm_size", ""),
            ("pci_atomic_caps", ""),
            ("xrc_odp_caps", ""),
            ("phys_port_cnt_ex", ""),
        ],
    ),
    (
        "ibv_port_attr",
        "struct ibv_port_attr",
        &[
            ("state", ""),
            ("max_mtu", ""),
            ("active_mtu", ""),
            ("gid_tbl_len", ""),
            ("port_cap_flags", ""),
            ("max_msg_sz", ""),
            ("pkey_tbl_len", ""),
            ("lid", ""),
            ("sm_lid", ""),
            ("lmc", ""),
            ("phys_state", ""),
            ("link_layer", ""),
            ("flags", ""),
            ("port_cap_flags2", ""),
        ],
    ),
    (
        "ibv_gid_entry",
        "struct ibv_gid_entry",
        &[
            ("gid", ""),
            ("gid_index", ""),
            ("port_num", ""),
            ("gid_type", ""),
            ("ndev_ifindex", ""),
        ],
    ),
    (
        "ibv_async_event",
        "struct ibv_async_event",
        &[("element", ""), ("event_type", "")],
    ),
    (
        "ibv_wc",
        "struct ibv_wc",
        &[
            ("wr_id", ""),
            ("status", ""),
            ("opcode", ""),
            ("vendor_err", ""),
            ("byte_len", ""),
            ("imm_data", ""),
            ("qp_num", ""),
            ("src_qp", ""),
            ("wc_flags", ""),
            ("pkey_index", ""),
            ("slid", ""),
            ("sl", ""),
            ("dlid_path_bits", ""),
        ],
    ),
    (
        "ibv_pd",
        "struct ibv_pd",
        &[("context", ""), ("handle", "")],
    ),
    (
        "ibv_mr",
        "struct ibv_mr",
        &[
            ("context", ""),
            ("pd", ""),
            ("addr", ""),
            ("length", ""),
            ("handle", ""),
            ("lkey", ""),
            ("rkey", ""),
        ],
    ),
    (
        "ibv_global_route",
        "struct ibv_global_route",
        &[
            ("dgid", ""),
            ("flow_label", ""),
            ("sgid_index", ""),
            ("hop_limit", ""),
            ("traffic_class", ""),
        ],
    ),
    (
        "ibv_grh",
        "struct ibv_grh",
        &[
            ("version_tclass_flow", ""),
            ("paylen", ""),
            ("next_hdr", ""),
            ("hop_limit", ""),
            ("sgid", ""),
            ("dgid", ""),
        ],
    ),
    (
        "ibv_ah_attr",
        "struct ibv_ah_attr",
        &[
            ("grh", ""),
            ("dlid", ""),
            ("sl", ""),
            ("src_path_bits", ""),
            ("static_rate", ""),
            ("is_global", ""),
            ("port_num", ""),
        ],
    ),
    (
        "ibv_srq_attr",
        "struct ibv_srq_attr",
        &[("max_wr", ""), ("max_sge", ""), ("srq_limit", "")],
    ),
    (
        "ibv_srq_init_attr",
        "struct ibv_srq_init_attr",
        &[("srq_context", ""), ("attr", "")],
    ),
    (
        "ibv_srq_init_attr_ex",
        "struct ibv_srq_init_attr_ex",
        &[
            ("srq_context", ""),
            ("attr", ""),
            ("comp_mask", ""),
            ("srq_type", ""),
            ("pd", ""),
            ("xrcd", ""),
            ("cq", ""),
            ("tm_cap", ""),
        ],
    ),
    (
        "ibv_qp_cap",
        "struct ibv_qp_cap",
        &[
            ("max_send_wr", ""),
            ("max_recv_wr", ""),
            ("max_send_sge", ""),
            ("max_recv_sge", ""),
            ("max_inline_data", ""),
        ],
    ),
    (
        "ibv_qp_init_attr",
        "struct ibv_qp_init_attr",
        &[
            ("qp_context", ""),
            ("send_cq", ""),
            ("recv_cq", ""),
            ("srq", ""),
            ("cap", ""),
            ("qp_type", ""),
            ("sq_sig_all", ""),
        ],
    ),
    (
        "ibv_qp_init_attr_ex",
        "struct ibv_qp_init_attr_ex",
        &[
            ("qp_context", ""),
            ("send_cq", ""),
            ("recv_cq", ""),
            ("srq", ""),
            ("cap", ""),
            ("qp_type", ""),
            ("sq_sig_all", ""),
            ("comp_mask", ""),
            ("pd", ""),
            ("xrcd", ""),
            ("create_flags", ""),
            ("max_tso_header", ""),
            ("rwq_ind_tbl", ""),
            ("rx_hash_conf", ""),
            ("source_qpn", ""),
            ("send_ops_flags", ""),
        ],
    ),
    (
        "ibv_qp_attr",
        "struct ibv_qp_attr",
        &[
            ("qp_state", ""),
            ("cur_qp_state", ""),
            ("path_mtu", ""),
            ("path_mig_state", ""),
            ("qkey", ""),
            ("rq_psn", ""),
            ("sq_psn", ""),
            ("dest_qp_num", ""),
            ("qp_access_flags", ""),
            ("cap", ""),
            ("ah_attr", ""),
            ("alt_ah_attr", ""),
            ("pkey_index", ""),
            ("alt_pkey_index", ""),
            ("en_sqd_async_notify", ""),
            ("sq_draining", ""),
            ("max_rd_atomic", ""),
            ("max_dest_rd_atomic", ""),
            ("min_rnr_timer", ""),
            ("port_num", ""),
            ("timeout", ""),
            ("retry_cnt", ""),
            ("rnr_retry", ""),
            ("alt_port_num", ""),
            ("alt_timeout", ""),
            ("rate_limit", ""),
        ],
    ),
    (
        "ibv_sge",
        "struct ibv_sge",
        &[("addr", ""), ("length", ""), ("lkey", "")],
    ),
    (
        "ibv_send_wr",
        "struct ibv_send_wr",
        &[
            ("wr_id", ""),
            ("next", ""),
            ("sg_list", ""),
            ("num_sge", ""),
            ("opcode", ""),
            ("send_flags", ""),
            ("imm_data", ""),
            ("wr", ""),
            ("wr.rdma.remote_addr", ""),
            ("wr.rdma.rkey", ""),
            ("wr.atomic.remote_addr", ""),
            ("wr.atomic.compare_add", ""),
            ("wr.atomic.swap", ""),
            ("wr.atomic.rkey", ""),
            ("wr.ud.ah", ""),
            ("wr.ud.remote_qpn", ""),
            ("wr.ud.remote_qkey", ""),
            ("qp_type", ""),
            ("bind_mw", ""),
        ],
    ),
    (
        "ibv_recv_wr",
        "struct ibv_recv_wr",
        &[
            ("wr_id", ""),
            ("next", ""),
            ("sg_list", ""),
            ("num_sge", ""),
        ],
    ),
    (
        "ibv_data_buf",
        "struct ibv_data_buf",
        &[("addr", ""), ("length", "")],
    ),
    (
        "ibv_srq",
        "struct ibv_srq",
        &[
            ("context", ""),
            ("srq_context", ""),
            ("pd", ""),
            ("handle", ""),
            ("mutex", ""),
            ("cond", ""),
            ("events_completed", ""),
        ],
    ),
    (
        "ibv_qp",
        "struct ibv_qp",
        &[
            ("context", ""),
            ("qp_context", ""),
            ("pd", ""),
            ("send_cq", ""),
            ("recv_cq", ""),
            ("srq", ""),
            ("handle", ""),
            ("qp_num", ""),
            ("state", ""),
            ("qp_type", ""),
            ("mutex", ""),
            ("cond", ""),
            ("events_completed", ""),
        ],
    ),
    (
        "ibv_qp_ex",
        "struct ibv_qp_ex",
        &[
            ("qp_base", ""),
            ("comp_mask", ""),
            ("wr_id", ""),
            ("wr_flags", ""),
            ("wr_atomic_cmp_swp", ""),
            ("wr_atomic_fetch_add", ""),
            ("wr_bind_mw", ""),
            ("wr_local_inv", ""),
            ("wr_rdma_read", ""),
            ("wr_rdma_write", ""),
            ("wr_rdma_write_imm", ""),
            ("wr_send", ""),
            ("wr_send_imm", ""),
            ("wr_send_inv", ""),
            ("wr_send_tso", ""),
            ("wr_set_ud_addr", ""),
            ("wr_set_xrc_srqn", ""),
            ("wr_set_inline_data", ""),
            ("wr_set_inline_data_list", ""),
            ("wr_set_sge", ""),
            ("wr_set_sge_list", ""),
            ("wr_start", ""),
            ("wr_complete", ""),
            ("wr_abort", ""),
            ("wr_atomic_write", ""),
        ],
    ),
    (
        "ibv_comp_channel",
        "struct ibv_comp_channel",
        &[("context", ""), ("fd", ""), ("refcnt", "")],
    ),
    (
        "ibv_cq",
        "struct ibv_cq",
        &[
            ("context", ""),
            ("channel", ""),
            ("cq_context", ""),
            ("handle", ""),
            ("cqe", ""),
            ("mutex", ""),
            ("cond", ""),
            ("comp_events_completed", ""),
            ("async_events_completed", ""),
        ],
    ),
    (
        "ibv_cq_ex",
        "struct ibv_cq_ex",
        &[
            ("context", ""),
            ("channel", ""),
            ("cq_context", ""),
            ("handle", ""),
            ("cqe", ""),
            ("mutex", ""),
            ("cond", ""),
            ("comp_events_completed", ""),
            ("async_events_completed", ""),
            ("comp_mask", ""),
            ("status", ""),
            ("wr_id", ""),
            ("start_poll", ""),
            ("next_poll", ""),
            ("end_poll", ""),
            ("read_opcode", ""),
            ("read_vendor_err", ""),
            ("read_byte_len", ""),
            ("read_imm_data", ""),
            ("read_qp_num", ""),
            ("read_src_qp", ""),
            ("read_wc_flags", ""),
            ("read_slid", ""),
            ("read_sl", ""),
            ("read_dlid_path_bits", ""),
            ("read_completion_ts", ""),
            ("read_cvlan", ""),
            ("read_flow_tag", ""),
            ("read_tm_info", ""),
            ("read_completion_wallclock_ns", ""),
        ],
    ),
    (
        "ibv_cq_init_attr_ex",
        "struct ibv_cq_init_attr_ex",
        &[
            ("cqe", ""),
            ("cq_context", ""),
            ("channel", ""),
            ("comp_vector", ""),
            ("wc_flags", ""),
            ("comp_mask", ""),
            ("flags", ""),
            ("parent_domain", ""),
        ],
    ),
    (
        "ibv_ah",
        "struct ibv_ah",
        &[("context", ""), ("pd", ""), ("handle", "")],
    ),
    (
        "ibv_ece",
        "struct ibv_ece",
        &[("vendor_id", ""), ("options", ""), ("comp_mask", "")],
    ),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=exports.txt");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=/usr/include/infiniband/verbs.h");
    // Also the directory: a verbs.h installed after a build keeps its package's old
    // mtime, which cargo takes for "unchanged", so the check stayed skipped (and the
    // `c_layouts_were_checked_against_verbs_h` test failed) until a clean build. The
    // directory's own mtime moves when the file appears.
    println!("cargo:rerun-if-changed=/usr/include/infiniband");

    let exports = cabi::parse_exports(
        &std::fs::read_to_string(manifest.join("exports.txt")).expect("read exports.txt"),
        NODES,
    );
    let map = out.join("libibverbs.map");
    std::fs::write(&map, cabi::version_script(NODES, &exports)).expect("write version script");
    std::fs::write(
        out.join("exports.rs"),
        cabi::exports_asm(&exports, "crate::api", "__softhca_ibv_alias_"),
    )
    .expect("write exports.rs");

    let probe = cabi::layout_probe_source(&["infiniband/verbs.h"], "crate::abi", LAYOUTS);
    let checked = match cabi::layout_asserts(
        &out,
        "softhca-ibverbs",
        Path::new("/usr/include/infiniband/verbs.h"),
        "libibverbs-dev",
        &probe,
    ) {
        Some(asserts) => {
            std::fs::write(out.join("layout_check.rs"), asserts).expect("write layout_check.rs");
            true
        }
        None => {
            std::fs::write(out.join("layout_check.rs"), "// verbs.h not found\n")
                .expect("write layout_check.rs");
            false
        }
    };
    println!(
        "cargo:rustc-env=SOFTHCA_IBVERBS_LAYOUT_CHECKED={}",
        u8::from(checked)
    );

    cabi::link_so_1(&out, "softhca-ibverbs", "libibverbs.so", "libibverbs.so.1");

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
