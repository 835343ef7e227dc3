//! `softhca-impair paths table`: softhca multipath, softhca single-path RC and the
//! kernel's MPTCP side by side on the same shaped parallel paths, in one run:
//! aggregation over 2 and 4 paths, one slow path, repeated silent cuts of one path (both
//! directions, then data only, then ACKs only), all paths cut shorter and longer than
//! the retry budget, 1 % loss on one path, QD1 latency beside bulk traffic with a slow
//! path, and CPU per GB. Text on stdout, JSON with `--json FILE`.

mod flow;
mod metrics;

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde_json::{json, Value};
use softhca_testbed::{Direction, End, Fault, Paths};

use flow::{Bed, Event, Timeline, Transport};

/// Options of `softhca-impair paths table`.
#[derive(Debug, Args)]
pub struct MpTableArgs {
    /// Seconds per throughput row.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Cuts per cut row, rotating over the paths (20 for the full table).
    #[arg(long, default_value_t = 20)]
    cuts: usize,
    /// Seconds a cut path stays cut.
    #[arg(long, default_value_t = 1.0)]
    cut_secs: f64,
    /// Seconds after a restore before the next cut.
    #[arg(long, default_value_t = 1.0)]
    restore_secs: f64,
    /// Seconds every path is cut in the short all-paths row (within the retry budget).
    #[arg(long, default_value_t = 0.2)]
    short_cut: f64,
    /// Seconds every path is cut in the long all-paths row (beyond the retry budget).
    #[arg(long, default_value_t = 6.0)]
    long_cut: f64,
    /// softhca sprays by UDP source port over ECMP (loopback /32s) instead of using one
    /// address pair per path (MPTCP always uses the address pairs).
    #[arg(long)]
    ecmp: bool,
    /// Source ports per address pair (`--ecmp`).
    #[arg(long, default_value_t = 8)]
    sports: u32,
    /// Only these rows: agg2, agg4, slow, cut, cut-data, cut-ack, all-short, all-long,
    /// loss, latency (cpu comes with agg4).
    #[arg(long, value_delimiter = ',')]
    rows: Vec<String>,
    /// Only these transports: softhca_mp, softhca_sp, mptcp.
    #[arg(long, value_delimiter = ',')]
    transports: Vec<String>,
    /// softhca without congestion control (by default every softhca process has it).
    #[arg(long)]
    no_cc: bool,
    /// Base name of the test beds: namespaces NAME2-a/-b (two paths) and NAME4-a/-b (four
    /// paths), so that two tables can run side by side under different names.
    #[arg(long, default_value = "mpbt")]
    name: String,
    /// Also write the table as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The `softhca` binary (default: next to this one).
    #[arg(long)]
    softhca: Option<PathBuf>,
}

/// One transport's result in a row.
struct Cell {
    text: String,
    json: Value,
}

/// One row of the table.
struct Row {
    key: &'static str,
    title: String,
    goal: &'static str,
    cells: Vec<(Transport, Cell)>,
}

/// What the rows share.
struct Table<'a> {
    a: &'a MpTableArgs,
    t0: Instant,
    transports: Vec<Transport>,
    rows: Vec<Row>,
}

impl Table<'_> {
    fn wants(&self, key: &str) -> bool {
        self.a.rows.is_empty() || self.a.rows.iter().any(|r| r == key)
    }

    fn say(&self, what: &str) {
        eprintln!("[{:>4.0} s] {what}", self.t0.elapsed().as_secs_f64());
    }

    /// Runs `cell` for every transport as row `key`.
    fn row(
        &mut self,
        key: &'static str,
        title: String,
        goal: &'static str,
        mut cell: impl FnMut(Transport) -> Result<Cell, String>,
    ) {
        if !self.wants(key) {
            return;
        }
        let mut cells = Vec::new();
        for t in self.transports.clone() {
            self.say(&format!("{title}: {} ...", t.label()));
            let c = cell(t).unwrap_or_else(|e| Cell {
                text: format!("error: {e}"),
                json: json!({ "error": e }),
            });
            self.say(&format!("  {}", c.text));
            cells.push((t, c));
        }
        self.rows.push(Row {
            key,
            title,
            goal,
            cells,
        });
    }
}

/// Runs the table.
pub fn run(a: MpTableArgs) -> Result<(), String> {
    let softhca = a
        .softhca
        .clone()
        .unwrap_or_else(crate::table::default_softhca);
    if !softhca.exists() {
        return Err(format!(
            "{} not found (cargo build --release -p softhca-cli, or --softhca PATH)",
            softhca.display()
        ));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let transports: Vec<Transport> = Transport::ALL
        .into_iter()
        .filter(|t| a.transports.is_empty() || a.transports.iter().any(|k| k == t.key()))
        .collect();
    let mut table = Table {
        a: &a,
        t0: Instant::now(),
        transports,
        rows: Vec::new(),
    };
    let gbit = 1_000_000_000;
    if table.wants("agg2") {
        let name2 = format!("{}2", a.name);
        let mut p = Paths::up(&name2, &[gbit; 2]).map_err(|e| e.to_string())?;
        let view = Paths::attach(&name2).map_err(|e| e.to_string())?;
        let bed = bed(&a, &view, &softhca, &me);
        table.row(
            "agg2",
            "aggregation, 2 × 1 Gb/s".into(),
            "≥ 0.92× Σ (MPTCP 0.90–0.94×)",
            |t| bulk_cell(&bed, &mut p, t, a.seconds),
        );
    }
    let name4 = format!("{}4", a.name);
    let mut p = Paths::up(&name4, &[gbit; 4]).map_err(|e| e.to_string())?;
    table.say(&format!(
        "4 paths of 1 Gb/s up ({name4}-a, {name4}-b); softhca {}",
        softhca.display()
    ));
    rows_on_four(&mut table, &mut p, &softhca, &me);
    drop(p);
    print_text(&table.rows);
    let doc = to_json(&a, &table.rows);
    if let Some(f) = &a.json {
        std::fs::write(f, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| format!("{}: {e}", f.display()))?;
    }
    Ok(())
}

fn bed<'a>(
    a: &MpTableArgs,
    p: &'a Paths,
    softhca: &'a std::path::Path,
    me: &'a std::path::Path,
) -> Bed<'a> {
    Bed {
        paths: p,
        softhca,
        me,
        cc: !a.no_cc,
        ecmp: a.ecmp,
        sports: a.sports,
    }
}

/// The rows on four paths of 1 Gb/s.
fn rows_on_four(
    table: &mut Table<'_>,
    p: &mut Paths,
    softhca: &std::path::Path,
    me: &std::path::Path,
) {
    let a = table.a;
    // `Bed` borrows the paths read-only for addresses; faults need them mutable, so
    // each flow gets a fresh view of the same namespaces.
    let Ok(view) = Paths::attach(&format!("{}4", a.name)) else {
        table.say("the paths just built are gone");
        return;
    };
    let bed = bed(a, &view, softhca, me);
    let gbit = 1_000_000_000;
    table.row(
        "agg4",
        "aggregation, 4 × 1 Gb/s".into(),
        "≥ 0.92× Σ (MPTCP 0.90–0.94×)",
        |t| bulk_cell(&bed, p, t, a.seconds),
    );
    let cpu: Vec<(Transport, f64)> = table
        .rows
        .last()
        .filter(|r| r.key == "agg4")
        .map(|r| {
            r.cells
                .iter()
                .filter_map(|(t, c)| Some((*t, c.json["cpu_s_per_gb"].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    if !cpu.is_empty() {
        cpu_row(table, &cpu);
    }
    table.row(
        "slow",
        "one path 10× slower (0.1 + 3 × 1 Gb/s)".into(),
        "≥ 0.90× Σ (MPTCP 0.51–0.68×)",
        |t| {
            let _ = p.set_rate(0, gbit / 10);
            let c = bulk_cell(&bed, p, t, a.seconds);
            let _ = p.set_rate(0, gbit);
            c
        },
    );
    let cut_goal = "gap ≤ 10 ms median, ≤ 20 ms worst; 90 % within 50 ms; 0 lost; RTS; restored path used within 1 s (MPTCP 30–210 ms)";
    for (key, dir, what) in [
        ("cut", Direction::Both, "silent cut of 1 of 4 paths"),
        (
            "cut-data",
            Direction::AToB,
            "one-way black hole, data direction",
        ),
        (
            "cut-ack",
            Direction::BToA,
            "one-way black hole, ACK direction",
        ),
    ] {
        let title = format!("{what}, ×{}", a.cuts);
        table.row(key, title, cut_goal, |t| cut_cell(&bed, p, t, dir, a));
    }
    table.row(
        "all-short",
        format!("all paths cut {} s", a.short_cut),
        "resumes, 0 lost",
        |t| all_cut_cell(&bed, p, t, a.short_cut),
    );
    table.row(
        "all-long",
        format!("all paths cut {} s", a.long_cut),
        "RETRY_EXC_ERR within timeout × retry, no hang",
        |t| all_cut_cell(&bed, p, t, a.long_cut),
    );
    table.row(
        "loss",
        "1 % loss on one path (both directions)".into(),
        "≥ 0.85× Σ; retransmitted ≤ 1.5× lost",
        // Path 0, the one single-path RC (and MPTCP's first subflow) uses, as for the
        // slow path: the single-path rows show what multipath spares them.
        |t| {
            let _ = p.set_fault(0, Direction::Both, Fault::Loss(0.01));
            let c = bulk_cell(&bed, p, t, a.seconds);
            let _ = p.set_fault(0, Direction::Both, Fault::Clear);
            c
        },
    );
    table.row(
        "latency",
        "QD1 4 KiB WRITE p99 beside bulk, one path 10× slower".into(),
        "≤ 1.3× p99 without the slow path",
        |t| lat_cell(&bed, p, t, a.seconds),
    );
}

/// `Σ` in Gb/s.
fn sum_gbps(p: &Paths) -> f64 {
    p.total_rate() as f64 / 1e9
}

/// Bytes the flow moved (softhca: messages × size; MPTCP: bytes received).
fn flow_bytes(j: &Value) -> u64 {
    j["bytes"]
        .as_u64()
        .unwrap_or_else(|| j["iters"].as_u64().unwrap_or(0) * j["size"].as_u64().unwrap_or(0))
}

/// Verified and state, as text and JSON.
fn outcome(tl: &Timeline) -> (String, Value) {
    let f = &tl.flow;
    let verified = f.json["verified"].as_bool().unwrap_or(false);
    let state = match &f.error {
        None => "no error completion".to_string(),
        Some(e) => e.clone(),
    };
    let check = match (f.json.is_null(), verified) {
        (true, _) => "no result to verify",
        (false, true) => "verified",
        (false, false) => "NOT verified",
    };
    let text = format!(
        "{check} · {}",
        if f.error.is_none() { "RTS" } else { &state }
    );
    (
        text,
        json!({ "verified": verified, "ok": f.ok, "state": state }),
    )
}

/// Per-path shares of the bytes A sent, from the counters before and after the flow.
fn shares(tl: &Timeline) -> Vec<f64> {
    let (Some(first), Some(last)) = (tl.stats.first(), tl.stats.last()) else {
        return Vec::new();
    };
    let d: Vec<u64> = last
        .1
        .iter()
        .zip(&first.1)
        .map(|(b, a)| b.since(a).ab_bytes)
        .collect();
    let sum = d.iter().sum::<u64>().max(1) as f64;
    d.iter().map(|&x| x as f64 / sum).collect()
}

/// Packets lost in the data direction (faults and shaper drops) over the flow, and the
/// packets retransmitted (softhca: sent minus what the messages need; MPTCP: TCP
/// RetransSegs of end A).
fn retransmissions(tl: &Timeline, t: Transport, retrans_tcp: u64) -> (u64, Option<u64>) {
    let lost = match (tl.stats.first(), tl.stats.last()) {
        (Some(a), Some(b)) => {
            b.1.iter()
                .zip(&a.1)
                .map(|(y, x)| {
                    let d = y.since(x);
                    d.ab_faulted + d.ab_shaper_drops
                })
                .sum()
        }
        _ => 0,
    };
    let j = &tl.flow.json;
    let retx = match t {
        Transport::Mptcp => Some(retrans_tcp),
        _ => {
            let (iters, size, mtu) = (j["iters"].as_u64(), j["size"].as_u64(), j["mtu"].as_u64());
            let c = &tl.flow.counters;
            // Path probes, their answers, SACKs and the negotiation MADs are packets
            // sent too, not retransmissions.
            let keys = [
                "mp_probe_sent",
                "mp_probe_answered",
                "mp_sack_sent",
                "mp_hello_sent",
            ];
            let extra: u64 = keys.iter().filter_map(|k| c.get(*k)).sum();
            match (iters, size, mtu, c.get("sent_pkts").copied()) {
                (Some(i), Some(s), Some(m), Some(sent)) if m > 0 => {
                    Some(sent.saturating_sub(i * s.div_ceil(m) + extra))
                }
                _ => None,
            }
        }
    };
    (lost, retx)
}

/// TCP segments end A retransmitted so far (`/proc/net/snmp` in its namespace).
fn tcp_retrans(p: &Paths) -> u64 {
    let out = p.command(End::A, "cat").arg("/proc/net/snmp").output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let tcp: Vec<&str> = text.lines().filter(|l| l.starts_with("Tcp:")).collect();
    let (Some(h), Some(v)) = (tcp.first(), tcp.get(1)) else {
        return 0;
    };
    h.split_whitespace()
        .zip(v.split_whitespace())
        .find(|(k, _)| *k == "RetransSegs")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// A bulk flow: goodput against the sum of the path rates, shares, CPU, losses.
fn bulk_cell(bed: &Bed<'_>, p: &mut Paths, t: Transport, secs: f64) -> Result<Cell, String> {
    let r0 = tcp_retrans(p);
    let (tl, _) = flow::run(bed, p, t, secs, &[], false)?;
    let r1 = tcp_retrans(p);
    let j = &tl.flow.json;
    let gbps = j["gbps"].as_f64().unwrap_or(0.0);
    let sum = sum_gbps(p);
    let bytes = flow_bytes(j);
    let cpu_per_gb = tl.cpu / (bytes as f64 / 1e9).max(1e-9);
    let sh = shares(&tl);
    let (lost, retx) = retransmissions(&tl, t, r1.saturating_sub(r0));
    // Pauses without any fault (past the first 0.5 s): the floor under the cut rows'.
    let s = &tl.flow.samples;
    let from = s.first().map_or(0.0, |x| x.0 + 0.5);
    let pause = metrics::longest_gap(s, from, tl.flow.exited_at, tl.flow.exited_at);
    let (otext, ojson) = outcome(&tl);
    let sh_text: Vec<String> = sh.iter().map(|s| format!("{:.0}", s * 100.0)).collect();
    let retx_text = retx.map_or("?".into(), |r| r.to_string());
    Ok(Cell {
        text: format!(
            "{gbps:.3} Gb/s = {:.2}× Σ · shares {} % · longest pause {} ms · {otext} · {cpu_per_gb:.2} CPU s/GB · retx/lost {retx_text}/{lost} pkts",
            gbps / sum,
            sh_text.join("/"),
            ms(pause)
        ),
        json: json!({
            "gbps": gbps, "x_sum": gbps / sum, "sum_gbps": sum, "shares": sh,
            "bytes": bytes, "longest_pause_s": pause, "cpu_s": tl.cpu, "cpu_s_per_gb": cpu_per_gb,
            "lost_pkts": lost, "retransmitted_pkts": retx, "outcome": ojson,
            "counters": tl.flow.counters,
        }),
    })
}

/// CPU seconds per GB of the 4-path aggregation row, against single-path RC.
fn cpu_row(table: &mut Table<'_>, cpu: &[(Transport, f64)]) {
    let sp = cpu
        .iter()
        .find(|c| c.0 == Transport::SinglePath)
        .map(|c| c.1);
    let cells = cpu
        .iter()
        .map(|&(t, c)| {
            let ratio = sp.map(|s| c / s.max(1e-9));
            let text = match ratio {
                Some(r) => format!("{c:.2} s/GB ({r:.2}× single-path RC)"),
                None => format!("{c:.2} s/GB"),
            };
            (
                t,
                Cell {
                    text,
                    json: json!({ "cpu_s_per_gb": c, "x_single_path": ratio }),
                },
            )
        })
        .collect();
    table.rows.push(Row {
        key: "cpu",
        title: "CPU per GB (4 × 1 Gb/s row, both ends)".into(),
        goal: "≤ 1.2× single-path RC",
        cells,
    });
}

/// Repeated cuts of one path at a time (rotating), each `cut_secs` long.
fn cut_cell(
    bed: &Bed<'_>,
    p: &mut Paths,
    t: Transport,
    dir: Direction,
    a: &MpTableArgs,
) -> Result<Cell, String> {
    let n = p.len();
    let period = a.cut_secs + a.restore_secs;
    let look = a.restore_secs.min(1.0) * 0.95;
    let mut events = Vec::new();
    for k in 0..a.cuts {
        let at = 1.0 + k as f64 * period;
        events.push((at, Event::Fault(k % n, dir, Fault::Cut)));
        events.push((at + a.cut_secs, Event::Fault(k % n, dir, Fault::Clear)));
        events.push((at + a.cut_secs + look, Event::Snapshot));
    }
    let secs = 1.0 + a.cuts as f64 * period + 0.5;
    let (tl, _) = flow::run(bed, p, t, secs, &events, false)?;
    let s = &tl.flow.samples;
    let end = tl.flow.exited_at;
    let total = sum_gbps(p);
    let (mut gaps, mut rec_cut, mut rec_res, mut used) = (vec![], vec![], vec![], vec![]);
    let mut at_cut = vec![];
    for k in 0..a.cuts {
        let (Some(c), Some(r)) = (tl.events.get(3 * k), tl.events.get(3 * k + 1)) else {
            break;
        };
        let (tc, tr) = (c.0, r.0);
        if tc >= end {
            break;
        }
        let next = tr + a.restore_secs;
        gaps.push(metrics::longest_gap(s, tc, next, end));
        at_cut.push(metrics::longest_gap(s, tc, tc + AT_CUT_SECS, end));
        let pre = metrics::rate(s, tc - 0.5, tc);
        let path = k % n;
        let remaining = total - p.rate(path) as f64 / 1e9;
        rec_cut.push(metrics::time_to(s, tc, tr, 0.9 * pre.min(remaining)));
        rec_res.push(metrics::time_to(s, tr, next, 0.9 * pre.min(total)));
        // Counters right after the restore (index 2 + 3k) and `look` later (3 + 3k).
        if let (Some(x), Some(y)) = (tl.stats.get(2 + 3 * k), tl.stats.get(3 + 3 * k)) {
            let d: Vec<u64> =
                y.1.iter()
                    .zip(&x.1)
                    .map(|(b, a)| b.since(a).ab_bytes)
                    .collect();
            let sum = d.iter().sum::<u64>().max(1) as f64;
            used.push(d.get(path).copied().unwrap_or(0) as f64 / sum);
        }
    }
    cut_summary(&tl, [&gaps, &at_cut], &rec_cut, &rec_res, &used)
}

/// The stretch after a cut whose longest gap is the cut's own (beside the longest of
/// the whole cut and restore, which also holds the run's pauses without a fault).
const AT_CUT_SECS: f64 = 0.2;

fn ms(v: f64) -> String {
    format!("{:.0}", v * 1000.0)
}

/// Median and worst of times that may be missing ("never" counted apart).
fn times_text(v: &[Option<f64>]) -> (String, Value) {
    let got: Vec<f64> = v.iter().flatten().copied().collect();
    let never = v.len() - got.len();
    let text = match metrics::median_max(&got) {
        Some((m, x)) => format!("{}/{} ms", ms(m), ms(x)),
        None => "—".into(),
    };
    let text = if never > 0 {
        format!("{text}, never {never}×")
    } else {
        text
    };
    (text, json!({ "seconds": v, "never": never }))
}

fn cut_summary(
    tl: &Timeline,
    [gaps, at_cut]: [&[f64]; 2],
    rec_cut: &[Option<f64>],
    rec_res: &[Option<f64>],
    used: &[f64],
) -> Result<Cell, String> {
    let (otext, ojson) = outcome(tl);
    let mm = |v: &[f64]| {
        metrics::median_max(v).map_or("—".into(), |(m, x)| format!("{}/{} ms", ms(m), ms(x)))
    };
    let (gap, first) = (mm(gaps), mm(at_cut));
    let (ct, cj) = times_text(rec_cut);
    let (rt, rj) = times_text(rec_res);
    let min_used = used.iter().copied().fold(f64::INFINITY, f64::min);
    let used_text = if used.is_empty() {
        "—".into()
    } else {
        format!("{:.0} %", min_used * 100.0)
    };
    Ok(Cell {
        text: format!(
            "{} cuts · gap median/max {gap} (in the {} ms after the cut {first}) · 90 % after cut {ct}, after restore {rt} · restored path share ≥ {used_text} in its first second · {otext}",
            gaps.len(),
            ms(AT_CUT_SECS)
        ),
        json: json!({
            "cuts": gaps.len(), "gaps_s": gaps, "gaps_at_cut_s": at_cut, "to_90pct_after_cut": cj,
            "to_90pct_after_restore": rj, "restored_path_share": used, "outcome": ojson,
            "gbps": tl.flow.json["gbps"], "counters": tl.flow.counters,
        }),
    })
}

/// Every path cut for `dur` seconds, then restored.
fn all_cut_cell(bed: &Bed<'_>, p: &mut Paths, t: Transport, dur: f64) -> Result<Cell, String> {
    let events = [
        (1.0, Event::FaultAll(Direction::Both, Fault::Cut)),
        (1.0 + dur, Event::FaultAll(Direction::Both, Fault::Clear)),
    ];
    let secs = 1.0 + dur + 2.0;
    let (tl, _) = flow::run(bed, p, t, secs, &events, false)?;
    let s = &tl.flow.samples;
    let (tc, tr) = (tl.events[0].0, tl.events[1].0);
    let end = tl.flow.exited_at;
    let gap = metrics::longest_gap(s, tc, end, end);
    let resumed = metrics::bytes_at(s, end) > metrics::bytes_at(s, tr + 0.001);
    let (otext, ojson) = outcome(&tl);
    let fate = match &tl.flow.error {
        Some(_) => format!("failed {:.2} s after the cut", end - tc),
        None if resumed => format!("resumed, longest pause {} ms", ms(gap)),
        None => "did not resume".into(),
    };
    Ok(Cell {
        text: format!("{fate} · {otext}"),
        json: json!({
            "cut_s": dur, "resumed": resumed, "longest_gap_s": gap,
            "exit_after_cut_s": end - tc, "outcome": ojson,
        }),
    })
}

/// QD1 4 KiB latency beside a bulk flow, with all paths at 1 Gb/s and with path 0 at
/// 100 Mb/s.
fn lat_cell(bed: &Bed<'_>, p: &mut Paths, t: Transport, secs: f64) -> Result<Cell, String> {
    let mut out = Vec::new();
    for slow in [false, true] {
        if slow {
            p.set_rate(0, p.rate(0) / 10).map_err(|e| e.to_string())?;
        }
        let r = flow::run(bed, p, t, secs, &[], true);
        if slow {
            p.set_rate(0, p.rate(0) * 10).map_err(|e| e.to_string())?;
        }
        let (tl, lat) = r?;
        let lat = lat.ok_or("no latency flow")?;
        let p99 = lat.json["lat_us_p99"].as_f64();
        let p50 = lat.json["lat_us_p50"].as_f64();
        out.push((
            p50,
            p99,
            tl.flow.json["gbps"].as_f64().unwrap_or(0.0),
            lat.error,
        ));
    }
    let f = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.0}"));
    let ratio = match (out[0].1, out[1].1) {
        (Some(a), Some(b)) if a > 0.0 => Some(b / a),
        _ => None,
    };
    let errs: Vec<String> = out.iter().filter_map(|o| o.3.clone()).collect();
    Ok(Cell {
        text: format!(
            "p99 {} µs → {} µs with the slow path ({}) · p50 {} → {} µs · bulk {:.2} / {:.2} Gb/s{}",
            f(out[0].1),
            f(out[1].1),
            ratio.map_or("?".into(), |r| format!("{r:.2}×")),
            f(out[0].0),
            f(out[1].0),
            out[0].2,
            out[1].2,
            if errs.is_empty() { String::new() } else { format!(" · {}", errs.join("; ")) }
        ),
        json: json!({
            "p99_us": out[0].1, "p99_us_slow": out[1].1, "x": ratio,
            "p50_us": out[0].0, "p50_us_slow": out[1].0,
            "bulk_gbps": out[0].2, "bulk_gbps_slow": out[1].2, "errors": errs,
        }),
    })
}

fn print_text(rows: &[Row]) {
    let ts: Vec<Transport> = rows
        .first()
        .map(|r| r.cells.iter().map(|c| c.0).collect())
        .unwrap_or_default();
    let head: Vec<&str> = ts.iter().map(|t| t.label()).collect();
    println!("| row | goal | {} |", head.join(" | "));
    println!("|---|---|{}", "---|".repeat(ts.len()));
    for r in rows {
        let cells: Vec<&str> = r.cells.iter().map(|c| c.1.text.as_str()).collect();
        println!("| {} | {} | {} |", r.title, r.goal, cells.join(" | "));
    }
}

fn to_json(a: &MpTableArgs, rows: &[Row]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let results: serde_json::Map<String, Value> = r
                .cells
                .iter()
                .map(|(t, c)| {
                    (
                        t.key().to_string(),
                        json!({ "text": c.text, "data": c.json }),
                    )
                })
                .collect();
            json!({ "key": r.key, "title": r.title, "goal": r.goal, "results": results })
        })
        .collect();
    let command: Vec<String> = std::env::args().collect();
    json!({
        "command": command.join(" "),
        "paths": "tbf rate R burst 256kb latency 5ms on both ends of each veth pair",
        "mode": if a.ecmp { "ecmp" } else { "address pairs" },
        "congestion_control": !a.no_cc,
        "seconds": a.seconds, "cuts": a.cuts, "cut_secs": a.cut_secs,
        "restore_secs": a.restore_secs,
        "rows": rows,
    })
}
