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

use std::path::PathBuf;

use softhca_cabi_build as cabi;

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

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=exports.txt");
    println!("cargo:rerun-if-changed=build.rs");

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

    cabi::link_so_1(&out, "softhca-ibverbs", "libibverbs.so", "libibverbs.so.1");

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
