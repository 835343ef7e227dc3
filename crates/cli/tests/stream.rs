//! `softhca stream`: the three modes on loopback, and the `--compare` JSON.

use std::process::Command;

#[test]
fn compare_json_has_three_complete_rows() {
    let dir = std::env::temp_dir().join(format!("softhca-cli-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("cmp.json");
    let png = dir.join("frame.png");
    let out = Command::new(env!("CARGO_BIN_EXE_softhca"))
        .env_remove("SOFTHCA_ADDR")
        .env("SOFTHCA_LOG", "off")
        .args([
            "stream",
            "--compare",
            "--frames",
            "10",
            "--width",
            "640",
            "--height",
            "480",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--save-frame")
        .arg(&png)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("rc-send") && stdout.contains("uc-write") && stdout.contains("gvsp"));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["rc-send", "uc-write", "gvsp"]);
    for r in rows {
        assert_eq!(r["counters"]["complete"], 10, "{r}");
        assert_eq!(r["corrupt"], 0, "{r}");
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gvsp_with_loss_recovers() {
    let out = Command::new(env!("CARGO_BIN_EXE_softhca"))
        .env_remove("SOFTHCA_ADDR")
        .args([
            "stream", "--mode", "gvsp", "--frames", "10", "--width", "640", "--height", "480",
            "--loss", "0.01",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let row = stdout.lines().find(|l| l.starts_with("gvsp")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "10", "{row}");
}
