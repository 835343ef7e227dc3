//! The built library exports exactly the names and versions of the system's
//! librdmacm.so.1 (rdma-core 44), compared with `objdump -T`, and links as it does.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const SYSTEM: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

fn exports(lib: &Path) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("run objdump");
    assert!(out.status.success(), "objdump -T {} failed", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" g ") && !l.contains("*UND*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = f.last()?.to_string();
            let ver = f.get(f.len().checked_sub(2)?)?.to_string();
            (ver.trim_matches(|c| c == '(' || c == ')') != name).then_some((name, ver))
        })
        .collect()
}

fn objdump() -> bool {
    let ok = Command::new("objdump").arg("--version").output().is_ok();
    if !ok {
        eprintln!("SKIP: objdump missing (apt-get install binutils)");
    }
    ok
}

#[test]
fn exported_symbols_match_system_librdmacm() {
    let Some(dir) = common::lib_dir() else { return };
    if !Path::new(SYSTEM).exists() || !objdump() {
        eprintln!("SKIP: {SYSTEM} missing (apt-get install librdmacm1)");
        return;
    }
    let sys = exports(Path::new(SYSTEM));
    let ours = exports(&dir.join("librdmacm.so.1"));
    assert_eq!(sys.len(), 68, "system librdmacm exports {}", sys.len());
    let missing: Vec<_> = sys.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&sys).collect();
    assert!(missing.is_empty(), "missing from ours: {missing:?}");
    assert!(extra.is_empty(), "exported only by ours: {extra:?}");
}

#[test]
fn soname_and_needed() {
    let Some(dir) = common::lib_dir() else { return };
    if !objdump() {
        return;
    }
    let out = Command::new("objdump")
        .arg("-p")
        .arg(dir.join("librdmacm.so.1"))
        .output()
        .expect("objdump -p");
    let text = String::from_utf8_lossy(&out.stdout);
    let has = |k: &str, v: &str| {
        text.lines()
            .any(|l| l.contains(k) && l.trim_end().ends_with(v))
    };
    assert!(has("SONAME", "librdmacm.so.1"), "{text}");
    assert!(has("NEEDED", "libibverbs.so.1"), "{text}");
}

#[test]
fn c_layouts_were_checked_against_rdma_cma_h() {
    let checked = env!("SOFTHCA_RDMACM_LAYOUT_CHECKED") == "1";
    let header = Path::new("/usr/include/rdma/rdma_cma.h").exists();
    assert_eq!(
        checked, header,
        "layout check ran = {checked}, rdma_cma.h present = {header}"
    );
}
