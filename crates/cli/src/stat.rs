//! `softhca stat`: the devices of running processes, read from what each publishes
//! (`softhca::read_all`), in the words of `rdma res show qp` and `rdma statistic`; and
//! `softhca agent`, the same over HTTP (crate `softhca-agent`).

use std::io::Write;
use std::path::PathBuf;

use softhca::Snapshot;

use crate::args::{AgentArgs, StatArgs};
use crate::error::CliError;

/// The run directories to read: those given, else those `SOFTHCA_RUN_DIR` names, else
/// the usual places.
fn run_dirs(given: &[PathBuf]) -> Vec<PathBuf> {
    if !given.is_empty() {
        return given.to_vec();
    }
    softhca::Config::from_env()
        .map(|c| c.publish)
        .unwrap_or_default()
        .reader_dirs()
}

fn looked_in(dirs: &[PathBuf]) -> String {
    let v: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    if v.is_empty() {
        "nowhere: SOFTHCA_RUN_DIR is off".to_string()
    } else {
        v.join(", ")
    }
}

/// Prints the published devices (of `--pid` only, which must have one).
pub fn run(a: &StatArgs) -> Result<(), CliError> {
    let dirs = run_dirs(&a.run_dir);
    let mut all = softhca::read_all(&dirs);
    if let Some(pid) = a.pid {
        all.retain(|s| s.pid == pid);
        if all.is_empty() {
            return Err(CliError::Usage(format!(
                "no softhca device published by pid {pid} (looked in {})",
                looked_in(&dirs)
            )));
        }
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &all).map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(());
    }
    if all.is_empty() {
        writeln!(
            out,
            "no softhca device published (looked in {})",
            looked_in(&dirs)
        )?;
    }
    for s in &all {
        print_one(&mut out, s)?;
    }
    Ok(())
}

fn print_one(out: &mut impl Write, s: &Snapshot) -> Result<(), CliError> {
    let d = &s.device;
    let gids: Vec<String> = d.gids.iter().map(|g| g.ip.to_string()).collect();
    writeln!(
        out,
        "dev {} pid {} comm {} gids {} port {} active_mtu {} node_guid {}{}",
        s.key,
        s.pid,
        s.command,
        gids.join(","),
        d.udp_port,
        d.active_mtu,
        d.node_guid,
        d.netdev
            .as_ref()
            .map(|n| format!(" netdev {n}"))
            .unwrap_or_default()
    )?;
    // `rdma res show qp`'s line, with what softhca adds (peer, unacknowledged PSN,
    // outstanding work).
    for q in &s.qps {
        let peer = q.peer.map(|p| format!(" peer {p}")).unwrap_or_default();
        writeln!(
            out,
            "link {}/1 lqpn {} rqpn {} type {} state {} rq-psn {} sq-psn {} una-psn {} pdn {}{} \
             send-queued {} recv-posted {} inflight-psns {}",
            s.key,
            q.qpn,
            q.dest_qpn,
            q.qp_type,
            q.state,
            q.rq_psn,
            q.sq_psn,
            q.una_psn,
            q.pd,
            peer,
            q.send_queued,
            q.recv_posted,
            q.inflight_psns
        )?;
        for line in &q.multipath {
            writeln!(out, "    {line}")?;
        }
    }
    // `rdma statistic`'s line: the counters that moved.
    let moved: Vec<String> = s
        .counters
        .iter()
        .filter(|(_, &v)| v != 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    writeln!(out, "link {}/1 {}", s.key, moved.join(" "))?;
    Ok(())
}

/// Serves the agent until interrupted.
pub fn agent(a: &AgentArgs) -> Result<(), CliError> {
    let cfg = softhca_agent::AgentConfig {
        listen: a.listen,
        run_dirs: run_dirs(&a.run_dir),
    };
    softhca_agent::run(cfg).map_err(|e| CliError::Usage(e.to_string()))
}
