//! `ibv_devices` and `ibv_devinfo -v` (ibverbs-utils) on the soft device.

mod common;

#[test]
fn ibv_devices_lists_softhca0() {
    if !common::have("ibv_devices") {
        return;
    }
    let out = common::run("ibv_devices", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("softhca0"))
        .unwrap_or_else(|| panic!("no softhca0 in:\n{text}"));
    // node GUID: 16 hex digits, softhca's locally administered EUI-64 prefix 02:53:48.
    let guid = line.split_whitespace().nth(1).unwrap_or("");
    assert_eq!(guid.len(), 16, "{line}");
    assert!(guid.starts_with("025348"), "{line}");
}

#[test]
fn ibv_devinfo_verbose_shows_active_roce_v2_port() {
    if !common::have("ibv_devinfo") {
        return;
    }
    let out = common::run("ibv_devinfo", &["-v"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("hca_id:\tsofthca0"), "{text}");
    assert!(text.contains("PORT_ACTIVE (4)"), "{text}");
    assert!(text.contains("link_layer:\t\tEthernet"), "{text}");
    assert!(text.contains("phys_port_cnt:\t\t\t1"), "{text}");
    // The GID table holds the device's addresses as RoCE v2 GIDs; one is always a
    // loopback address (127.0.0.x) of this process's own device.
    let gids: Vec<&str> = text.lines().filter(|l| l.contains("GID[")).collect();
    assert!(!gids.is_empty(), "{text}");
    assert!(gids.iter().all(|l| l.ends_with("RoCE v2")), "{gids:?}");
    assert!(
        gids.iter().any(|l| l.contains("::ffff:127.0.0.")),
        "no loopback GID: {gids:?}"
    );
}
