//! The reply path of a UD receive from C (`tests/c/ah_from_wc.c`): the GRH area of an
//! IPv4 RoCEv2 packet, `wc.sl` as the L3 type, and an address handle made from the
//! completion (`ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`) that reaches the sender.

mod common;

use std::path::PathBuf;

#[test]
fn ud_reply_through_an_ah_from_the_completion() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/ah_from_wc.c");
    let Some(bin) = common::compile_c(&src, "ah_from_wc") else {
        return;
    };
    let _g = common::serial();
    let out = common::cmd(bin.to_str().expect("utf-8 path"))
        .env("SOFTHCA_ADDR", "127.0.5.30")
        .output()
        .expect("run ah_from_wc");
    let _ = std::fs::remove_file(&bin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok: ")).count(),
        2,
        "{text}"
    );
    assert!(text.contains("all ah_from_wc checks passed"), "{text}");
}
