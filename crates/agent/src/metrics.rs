//! The devices' counters in the Prometheus text exposition format (version 0.0.4).
//!
//! Each softhca counter becomes `softhca_<name>_total` (a counter) and each gauge
//! (`gauge_*`, the offload switches `io_gso`/`io_gro`) `softhca_<name>`, labelled with
//! the process and device; QPs are counted by state.

use std::collections::BTreeMap;
use std::fmt::Write;

use softhca::Snapshot;

/// Whether a softhca counter name is a level rather than a running count.
fn is_gauge(name: &str) -> bool {
    name.starts_with("gauge_") || name == "io_gso" || name == "io_gro"
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(s: &Snapshot) -> String {
    format!(
        "pid=\"{}\",command=\"{}\",device=\"{}\"",
        s.pid,
        escape(&s.command),
        escape(&s.key)
    )
}

/// Samples of one metric family, written together under its HELP and TYPE lines.
struct Family {
    help: String,
    gauge: bool,
    samples: Vec<String>,
}

fn family<'a>(
    families: &'a mut BTreeMap<String, Family>,
    metric: &str,
    help: &str,
    gauge: bool,
) -> &'a mut Vec<String> {
    &mut families
        .entry(metric.to_string())
        .or_insert_with(|| Family {
            help: help.to_string(),
            gauge,
            samples: Vec::new(),
        })
        .samples
}

/// The exposition of every device in `snapshots`.
pub(crate) fn prometheus_text(snapshots: &[Snapshot]) -> String {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for s in snapshots {
        let l = labels(s);
        for (name, v) in &s.counters {
            let gauge = is_gauge(name);
            let metric = if gauge {
                format!("softhca_{name}")
            } else {
                format!("softhca_{name}_total")
            };
            let help = format!("softhca counter {name}, as softhca devinfo -v prints it");
            family(&mut families, &metric, &help, gauge).push(format!("{metric}{{{l}}} {v}"));
        }
        let mut by_state: BTreeMap<&str, u64> = BTreeMap::new();
        for qp in &s.qps {
            *by_state.entry(qp.state.as_str()).or_default() += 1;
        }
        let qps = family(&mut families, "softhca_qps", "QPs by state", true);
        for (state, n) in by_state {
            qps.push(format!("softhca_qps{{{l},state=\"{state}\"}} {n}"));
        }
        let gid0 = s.device.gids.first().map(|g| g.ip.to_string());
        let info = family(
            &mut families,
            "softhca_device_info",
            "A device: its node GUID, first GID and active MTU",
            true,
        );
        info.push(format!(
            "softhca_device_info{{{l},node_guid=\"{}\",gid0=\"{}\",active_mtu=\"{}\"}} 1",
            s.device.node_guid,
            gid0.unwrap_or_default(),
            s.device.active_mtu
        ));
    }
    let mut out = String::new();
    for (metric, f) in families {
        let kind = if f.gauge { "gauge" } else { "counter" };
        let _ = writeln!(out, "# HELP {metric} {}", f.help);
        let _ = writeln!(out, "# TYPE {metric} {kind}");
        for line in f.samples {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_escaping() {
        assert!(is_gauge("gauge_inflight_psns") && is_gauge("io_gso"));
        assert!(!is_gauge("sent_pkts"));
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
        assert_eq!(prometheus_text(&[]), "");
    }
}
