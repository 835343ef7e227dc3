//! The environment variables softhca reads are the ones `softhca::ENV_VARS` lists, the
//! README's configuration table shows, and the sources name: all three agree.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `SOFTHCA_*` names in `text` (an upper-case letter must follow the prefix).
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("SOFTHCA_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        // `SOFTHCA_PRIVATE_1` is a symbol version node of the drop-in libraries.
        let version_node = name.starts_with("SOFTHCA_PRIVATE_");
        if !version_node && name.as_bytes().get(8).is_some_and(u8::is_ascii_uppercase) {
            out.insert(name.to_string());
        }
        rest = &tail[end.max(8)..];
    }
    out
}

fn listed() -> BTreeSet<String> {
    softhca::ENV_VARS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect()
}

/// The variables in the first column of the README's configuration table.
fn readme_table() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Configuration"))
        .expect("README has a Configuration section");
    section
        .lines()
        .filter(|l| l.starts_with("| `SOFTHCA_"))
        .flat_map(|l| names_in(l.split('|').nth(1).unwrap_or("")))
        .collect()
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `crates/*/src/**/*.rs`.
fn crate_sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for c in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = c.unwrap().path().join("src");
        if src.is_dir() {
            rust_sources(&src, &mut files);
        }
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    files
}

#[test]
fn every_meaning_is_one_line() {
    for (name, meaning) in softhca::ENV_VARS {
        assert!(name.starts_with("SOFTHCA_"), "{name}");
        assert!(!meaning.is_empty() && !meaning.contains('\n'), "{name}");
    }
    assert_eq!(listed().len(), softhca::ENV_VARS.len(), "a name twice");
}

#[test]
fn readme_table_matches_env_vars() {
    let table = readme_table();
    let listed = listed();
    let missing: Vec<_> = listed.difference(&table).collect();
    let extra: Vec<_> = table.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "ENV_VARS not in README's table: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "README's table lists unknown variables: {extra:?}"
    );
}

#[test]
fn sources_name_only_listed_variables() {
    let listed = listed();
    let mut seen = BTreeSet::new();
    for f in crate_sources() {
        let text = std::fs::read_to_string(&f).unwrap();
        for n in names_in(&text) {
            assert!(
                listed.contains(&n),
                "{} names {n}, not in ENV_VARS",
                f.display()
            );
            seen.insert(n);
        }
    }
    // The scan found the variables: it did not pass by reading nothing.
    assert!(
        seen.contains("SOFTHCA_ADDR") && seen.contains("SOFTHCA_GSO"),
        "{seen:?}"
    );
}

#[test]
fn only_config_reads_the_environment() {
    let config = Path::new("softhca/src/config.rs");
    // The drop-in librdmacm cannot link the device crate (it would be a second copy of
    // the device beside libibverbs.so.1's), so it reads its one switch itself.
    let rdmacm_error = Path::new("rdmacm/src/error.rs");
    for f in crate_sources() {
        if f.ends_with(config) || f.ends_with(rdmacm_error) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let reads = line.contains("env::var") || line.contains("EnvFilter::from_env");
            assert!(
                !(reads && line.contains("SOFTHCA_")),
                "{}:{}: reads a SOFTHCA_ variable outside Config::from_env: {line}",
                f.display(),
                i + 1
            );
        }
    }
}

#[test]
fn names_in_finds_names_only() {
    let got = names_in("`SOFTHCA_GSO`, `SOFTHCA_GRO` and SOFTHCA_ alone, softhca_x");
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        ["SOFTHCA_GRO", "SOFTHCA_GSO"]
    );
}
