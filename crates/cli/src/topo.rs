//! `softhca topo`: the host's distance matrix (the logic is in softhca-topo).

use std::io::Write;

use softhca::Context;
use softhca_topo::{render_text, Topology};

use crate::args::TopoArgs;
use crate::error::CliError;

/// Prints the matrix, or JSON with `--json`.
pub fn run(a: &TopoArgs) -> Result<(), CliError> {
    let mut topo =
        Topology::read(&a.sysfs_root).map_err(|e| CliError::Usage(format!("topology: {e}")))?;
    for d in &a.device {
        let (name, netdev) = d
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("--device {d:?} is not NAME=NETDEV")))?;
        if topo.endpoint(netdev).is_none() {
            return Err(CliError::Usage(format!(
                "--device {d}: no interface {netdev}"
            )));
        }
        topo.add_softhca(name, Some(netdev));
    }
    if a.device.is_empty() && a.sysfs_root == std::path::Path::new("/") {
        // The device a verbs program started with this environment would get.
        match Context::open_default() {
            Ok(ctx) => topo.add_softhca(ctx.name(), ctx.netdev()),
            Err(e) => eprintln!("softhca: no softhca device placed: {e}"),
        }
    }
    let report = topo.report(a.all);
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(|e| CliError::Usage(format!("JSON output: {e}")))?;
        writeln!(out)?;
    } else {
        out.write_all(render_text(&report).as_bytes())?;
    }
    Ok(())
}
