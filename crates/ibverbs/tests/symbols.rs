//! The built library exports exactly the names and versions of the system's
//! libibverbs.so.1 (rdma-core 44), compared with `objdump -T`.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

const SYSTEM: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// (name, version) of every defined dynamic symbol; hidden versions keep their parentheses
/// (`(IBVERBS_1.0)`), version-definition symbols are left out.
fn exports(lib: &std::path::Path) -> BTreeSet<(String, String)> {
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

#[test]
fn exported_symbols_match_system_libibverbs() {
    if !std::path::Path::new(SYSTEM).exists() || !common::have("objdump") {
        eprintln!("SKIP: {SYSTEM} or objdump missing (apt-get install libibverbs1 binutils)");
        return;
    }
    let sys = exports(std::path::Path::new(SYSTEM));
    let mut ours = exports(&common::lib_dir().join("libibverbs.so.1"));
    // softhca's own private node, for its librdmacm.
    assert!(ours.remove(&("softhca_create_gsi_qp".into(), "SOFTHCA_PRIVATE_1".into())));
    ours.remove(&("SOFTHCA_PRIVATE_1".into(), "SOFTHCA_PRIVATE_1".into()));
    assert!(sys.len() > 150, "system library exports only {}", sys.len());
    let missing: Vec<_> = sys.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&sys).collect();
    assert!(missing.is_empty(), "missing from ours: {missing:?}");
    assert!(extra.is_empty(), "exported only by ours: {extra:?}");
    assert!(ours.contains(&("ibv_get_device_list".into(), "(IBVERBS_1.0)".into())));
    assert!(ours.contains(&("ibv_get_device_list".into(), "IBVERBS_1.1".into())));
    assert!(ours.contains(&("ibv_query_gid_type".into(), "IBVERBS_PRIVATE_34".into())));
}

#[test]
fn soname_is_libibverbs_so_1() {
    if !common::have("objdump") {
        return;
    }
    let out = Command::new("objdump")
        .arg("-p")
        .arg(common::lib_dir().join("libibverbs.so.1"))
        .output()
        .expect("objdump -p");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains("SONAME") && l.trim_end().ends_with("libibverbs.so.1")),
        "{text}"
    );
}

#[test]
fn c_layouts_were_checked_against_verbs_h() {
    // build.rs turns every sizeof/offsetof/alignof of the system verbs.h into a
    // compile-time assertion; it can only skip when the header is absent.
    let checked = softhca_verbs_abi::LAYOUT_CHECKED;
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h").exists();
    assert_eq!(
        checked, header,
        "layout check ran = {checked}, verbs.h present = {header}"
    );
}

#[test]
fn providers_that_perftest_links_load() {
    // perftest links libmlx5.so.1 and libefa.so.1 directly: every symbol they import from
    // libibverbs must resolve against ours, with its version.
    for p in ["libmlx5.so.1", "libefa.so.1"] {
        let path = format!("/usr/lib/x86_64-linux-gnu/{p}");
        if !std::path::Path::new(&path).exists() || !common::have("objdump") {
            eprintln!("SKIP: {path} not installed");
            continue;
        }
        let mut ours = exports(&common::lib_dir().join("libibverbs.so.1"));
        // softhca's own private node, for its librdmacm.
        assert!(ours.remove(&("softhca_create_gsi_qp".into(), "SOFTHCA_PRIVATE_1".into())));
        ours.remove(&("SOFTHCA_PRIVATE_1".into(), "SOFTHCA_PRIVATE_1".into()));
        let out = Command::new("objdump")
            .arg("-T")
            .arg(&path)
            .output()
            .expect("objdump");
        let needed: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("*UND*") && l.contains("IBVERBS"))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((
                    f.last()?.to_string(),
                    f.get(f.len() - 2)?
                        .trim_matches(|c| c == '(' || c == ')')
                        .to_string(),
                ))
            })
            .collect();
        assert!(!needed.is_empty(), "{p} imports nothing from libibverbs?");
        for (name, ver) in needed {
            assert!(
                ours.iter()
                    .any(|(n, v)| *n == name && v.trim_matches(|c| c == '(' || c == ')') == ver),
                "{p} needs {name}@{ver}"
            );
        }
    }
}
