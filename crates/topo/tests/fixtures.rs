//! The matrix of a QEMU guest with two NUMA nodes, three pxb host bridges and chained
//! pci-bridges (tests/capture-qemu.sh captured its /sys), which has every class.

use std::path::{Path, PathBuf};

use softhca_topo::{render_text, Kind, Link, Topology};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn link(t: &Topology, a: &str, b: &str) -> Link {
    let (a, b) = (t.endpoint(a).unwrap(), t.endpoint(b).unwrap());
    assert_eq!(
        t.link(a, b),
        t.link(b, a),
        "{} {} symmetric",
        a.name,
        b.name
    );
    t.link(a, b)
}

#[test]
fn every_class_in_the_two_node_guest() {
    let mut t = Topology::read(&fixture("qemu-2numa")).unwrap();
    assert_eq!(t.cpus.to_string(), "0-3");
    let nodes: Vec<_> = t
        .nodes
        .iter()
        .map(|n| (n.id, n.cpus.to_string(), n.distances.clone()))
        .collect();
    assert_eq!(
        nodes,
        [
            (0, "0-1".into(), vec![10, 20]),
            (1, "2-3".into(), vec![20, 10])
        ]
    );
    // eth4, eth5: one bridge below pxb0's root port; eth6 two bridges further down.
    assert_eq!(link(&t, "eth4", "eth4"), Link::X);
    assert_eq!(link(&t, "eth4", "eth5"), Link::Pix);
    assert_eq!(link(&t, "eth4", "nvme0"), Link::Pix);
    assert_eq!(link(&t, "eth4", "eth6"), Link::Pxb);
    // eth0, eth1 on the root bus: apart at the host bridge.
    assert_eq!(link(&t, "eth0", "eth1"), Link::Phb);
    // pxb2 (eth2) and pxb0 are both on node 0; pxb1 (eth3, the display) on node 1.
    assert_eq!(link(&t, "eth2", "eth4"), Link::Node);
    assert_eq!(link(&t, "eth2", "eth3"), Link::Sys);
    assert_eq!(link(&t, "eth3", "GPU0"), Link::Pix);
    assert_eq!(link(&t, "GPU0", "nvme0"), Link::Sys);
    // A root-bus device has no node (numa_node -1) on this two-node machine.
    assert_eq!(link(&t, "eth0", "eth4"), Link::Sys);
    let e3 = t.endpoint("eth3").unwrap();
    assert_eq!(
        (e3.numa, e3.cpus.to_string(), e3.pci.as_deref()),
        (Some(1), "2-3".into(), Some("0000:21:01.0"))
    );
    let e0 = t.endpoint("eth0").unwrap();
    assert_eq!((e0.numa, e0.cpus.to_string()), (None, "0-3".into()));
    // The VLAN sits on its parent's function; lo and dummy0 are virtual.
    let vlan = t.endpoint("eth3.10").unwrap();
    assert_eq!(
        (vlan.pci.as_deref(), vlan.netdev.as_deref()),
        (Some("0000:21:01.0"), Some("eth3"))
    );
    assert_eq!(link(&t, "eth3.10", "GPU0"), Link::Pix);
    assert!(t.endpoint("lo").unwrap().is_virtual && t.endpoint("dummy0").unwrap().is_virtual);
    assert_eq!(
        t.endpoints.iter().filter(|e| e.kind == Kind::Gpu).count(),
        1
    );
    t.add_softhca("softhca0", Some("eth2"));
    assert_eq!(link(&t, "softhca0", "eth2"), Link::X);
    assert_eq!(link(&t, "softhca0", "eth4"), Link::Node);
    let shown: Vec<_> = t.shown(false).iter().map(|e| e.name.clone()).collect();
    assert!(!shown.contains(&"lo".to_string()) && shown.contains(&"softhca0".to_string()));
    assert_eq!(t.shown(true).len(), t.endpoints.len());
}

#[test]
fn text_and_json_reports() {
    let mut t = Topology::read(&fixture("qemu-2numa")).unwrap();
    t.add_softhca("softhca0", Some("eth3"));
    let r = t.report(false);
    let text = render_text(&r);
    let row = text.lines().find(|l| l.starts_with("softhca0 ")).unwrap();
    assert!(
        row.contains("2-3") && row.ends_with("0000:21:01.0 via eth3"),
        "{row}"
    );
    for class in ["PIX", "PXB", "PHB", "NODE", "SYS"] {
        assert!(
            text.lines()
                .filter(|l| l.starts_with("eth"))
                .any(|l| l.contains(class)),
            "{class}"
        );
        assert!(text.contains(&format!("  {class:<4} = ")), "legend {class}");
    }
    let json = serde_json::to_value(&r).unwrap();
    let names: Vec<&str> = json["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let (i, j) = (
        names.iter().position(|n| *n == "eth2").unwrap(),
        names.iter().position(|n| *n == "eth3").unwrap(),
    );
    assert_eq!(json["matrix"][i][j], "SYS");
    assert_eq!(json["endpoints"][j]["numa"], 1);
    assert_eq!(json["endpoints"][j]["cpus"], "2-3");
    assert_eq!(
        json["numa_nodes"][1]["distances"],
        serde_json::json!([20, 10])
    );
}

#[test]
fn a_missing_tree_is_an_error() {
    let e = Topology::read(Path::new("/nonexistent"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("devices/system/cpu/online"), "{e}");
    let e = Topology::netdev(&fixture("qemu-2numa"), "eth9")
        .unwrap_err()
        .to_string();
    assert_eq!(e, "no network interface \"eth9\"");
}
