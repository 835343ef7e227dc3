//! Parsing of message sizes given on the command line (`4096`, `64K`, `1M`).

use crate::error::CliError;

use softhca_perf::MAX_MESSAGE;

/// Parses `N`, `NK`, `NM` or `NG` (binary multiples, case-insensitive, optional `B` or `iB`).
///
/// perftest takes plain byte counts; we also take the suffixes people type.
pub fn parse_size(text: &str) -> Result<u64, CliError> {
    let bad = || CliError::InvalidSize(text.to_string());
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits_end == 0 {
        return Err(bad());
    }
    let n: u64 = t[..digits_end].parse().map_err(|_| bad())?;
    let suffix = t[digits_end..].to_ascii_lowercase();
    let mult: u64 = match suffix.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    let v = n.checked_mul(mult).ok_or_else(bad)?;
    if v == 0 || v > MAX_MESSAGE {
        return Err(bad());
    }
    Ok(v)
}

/// clap value parser for sizes: the message is what `softhca: ` prints.
pub fn size_arg(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    }

    #[test]
    fn rejects() {
        for bad in [
            "12Q",
            "",
            "K",
            "0",
            "-1",
            "4G",
            "99999999999999999999",
            "1.5M",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert_eq!(e.to_string(), format!("invalid size '{bad}'"));
        }
    }
}
