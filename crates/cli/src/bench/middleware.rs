//! `softhca bench --middleware`: UCX and Open MPI over softhca against their own TCP
//! transports, on the same loopback, in one run.
//!
//! UCX: `ucx_perftest` tag bandwidth (64 KiB, 1 MiB) and tag latency (8 B) over
//! `rc_verbs` on softhca0 through the drop-in libibverbs, then over UCX's `tcp` on `lo`;
//! 64 KiB once more with the larger eager fragments the README suggests
//! (`UCX_IB_SEG_SIZE`).
//! Open MPI: a ping-pong (`mpi_pingpong.c`, built with mpicc) with `--mca pml ucx` on
//! softhca, then with `--mca pml ob1 --mca btl tcp,self` on `lo`. Each figure is measured
//! `runs` times, softhca and TCP alternating (the VM's speed drifts within a run), and
//! shown as median [min–max] with the ratio of the medians.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{wait_listening, write_file, ProgressLine, READY_TIMEOUT, SLACK};
use crate::args::BenchArgs;
use crate::error::CliError;
use crate::local::{free_device_pair, free_tcp_port, Finished, Proc};

/// The MPI program, built with mpicc into a temporary directory at run time.
const MPI_PINGPONG_C: &str = include_str!("mpi_pingpong.c");
/// The device node UCX needs before it uses a verbs device, and the command that makes it.
const UCX_DEVICE_NODE: &str = "/dev/infiniband/uverbs-softhca0";
const UCX_SETUP: &str =
    "sudo sh -c 'mkdir -p /dev/infiniband && ln -sfn /dev/null /dev/infiniband/uverbs-softhca0'";
/// UCX's transports on softhca: `rc_verbs` with `ud_verbs` for its wire-up (UCX needs
/// a connectionless transport beside a point-to-point one; its own alias `rc_v`).
const UCX_TLS_ON_SOFTHCA: &str = "rc_verbs,ud_verbs:aux";

/// Which software stack a figure is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Stack {
    Ucx,
    Mpi,
}

/// What carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
enum Via {
    Softhca,
    Tcp,
}

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Softhca => "softhca",
            Via::Tcp => "TCP",
        }
    }
}

/// One figure: bandwidth (MB/s) at `size`, or latency (us) when `lat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct Metric {
    stack: Stack,
    size: u64,
    lat: bool,
    /// `UCX_IB_SEG_SIZE` on softhca (UCX's eager fragment size); 0: UCX's default.
    seg_size: u32,
}

/// The eager fragment size the README suggests for messages of tens of KiB.
const TUNED_SEG_SIZE: u32 = 32832;

const METRICS: [Metric; 7] = [
    Metric::bw(Stack::Ucx, 65536),
    Metric::bw(Stack::Ucx, 65536).with_seg_size(TUNED_SEG_SIZE),
    Metric::bw(Stack::Ucx, 1 << 20),
    Metric::lat(Stack::Ucx),
    Metric::bw(Stack::Mpi, 65536),
    Metric::bw(Stack::Mpi, 1 << 20),
    Metric::lat(Stack::Mpi),
];

impl Metric {
    const fn bw(stack: Stack, size: u64) -> Metric {
        Metric {
            stack,
            size,
            lat: false,
            seg_size: 0,
        }
    }

    const fn with_seg_size(self, seg_size: u32) -> Metric {
        Metric { seg_size, ..self }
    }

    const fn lat(stack: Stack) -> Metric {
        Metric {
            stack,
            size: 8,
            lat: true,
            seg_size: 0,
        }
    }

    fn label(&self) -> String {
        let size = super::output::size_str(self.size);
        match (self.stack, self.lat) {
            (Stack::Ucx, false) if self.seg_size > 0 => {
                format!(
                    "UCX tag_bw {size}, UCX_IB_SEG_SIZE={} (MB/s)",
                    self.seg_size
                )
            }
            (Stack::Ucx, false) => format!("UCX tag_bw {size} (MB/s)"),
            (Stack::Ucx, true) => format!("UCX tag_lat {size} (us, p50)"),
            (Stack::Mpi, false) => format!("MPI ping-pong {size} (MB/s)"),
            (Stack::Mpi, true) => format!("MPI ping-pong {size} (us, p50)"),
        }
    }

    /// The issue's goal for this figure, as softhca/TCP: at least 1.0x TCP's bandwidth at
    /// 64 KiB, latency within 1.5x TCP's; with UCX's defaults.
    fn goal(&self) -> Option<(f64, bool)> {
        match (self.lat, self.size) {
            _ if self.seg_size > 0 => None,
            (true, _) => Some((1.5, false)),
            (false, 65536) => Some((1.0, true)),
            _ => None,
        }
    }
}

/// The samples of one figure on one transport.
#[derive(Debug, Default, Serialize)]
struct Samples {
    values: Vec<f64>,
    /// The client's command line of the last sample.
    command: String,
}

impl Samples {
    fn median(&self) -> Option<f64> {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    }

    fn range(&self) -> String {
        let min = self.values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self
            .values
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        match self.median() {
            Some(m) => format!("{} [{}-{}]", fig(m), fig(min), fig(max)),
            None => "failed".into(),
        }
    }
}

/// One row of the report.
#[derive(Debug, Serialize)]
struct MwRow {
    metric: Metric,
    label: String,
    softhca: Samples,
    tcp: Samples,
    /// softhca's median over TCP's.
    ratio: Option<f64>,
}

/// Everything the measurements need.
struct Mw {
    dropin: PathBuf,
    server_ip: IpAddr,
    client_ip: IpAddr,
    duration: f64,
    /// The built MPI program, when mpicc and mpirun are there.
    mpi: Option<PathBuf>,
}

/// Entry point of `softhca bench --middleware`.
pub(super) fn run(a: &BenchArgs, exe: &Path, duration: f64) -> Result<(), CliError> {
    let dropin = exe
        .parent()
        .map(Path::to_path_buf)
        .filter(|d| d.join("libibverbs.so.1").exists())
        .ok_or_else(|| {
            CliError::Usage(
                "no drop-in libibverbs.so.1 next to softhca (cargo build --release -p \
                 softhca-ibverbs)"
                    .into(),
            )
        })?;
    if !on_path("ucx_perftest") {
        return Err(CliError::Usage(
            "ucx_perftest not installed (apt-get install ucx-utils)".into(),
        ));
    }
    if !ucx_device_node() {
        return Err(CliError::Usage(format!(
            "{UCX_DEVICE_NODE} missing, so UCX skips softhca0: run {UCX_SETUP}"
        )));
    }
    let mut notes = Vec::new();
    let tmp = std::env::temp_dir().join(format!("softhca-bench-mpi-{}", std::process::id()));
    let mpi = build_mpi(&tmp, &mut notes);
    let (server_ip, client_ip) = free_device_pair()?;
    let mw = Mw {
        dropin,
        server_ip,
        client_ip,
        duration,
        mpi,
    };
    let runs = if a.quick { 1 } else { a.runs.max(1) };
    let metrics: Vec<Metric> = METRICS
        .into_iter()
        .filter(|m| m.stack == Stack::Ucx || mw.mpi.is_some())
        .collect();
    let mut rows: Vec<MwRow> = metrics
        .iter()
        .map(|&metric| MwRow {
            metric,
            label: metric.label(),
            softhca: Samples::default(),
            tcp: Samples::default(),
            ratio: None,
        })
        .collect();
    let mut failures = Vec::new();
    mw.measure_all(&mut rows, runs, &mut failures);
    let _ = std::fs::remove_dir_all(&tmp);
    for r in &mut rows {
        r.ratio = r.softhca.median().zip(r.tcp.median()).map(|(s, t)| s / t);
    }
    notes.extend(mw.notes(runs));
    let text = table(&rows, &notes, &failures, runs);
    print!("{text}");
    if let Some(p) = &a.json {
        let doc = serde_json::json!({ "runs": runs, "rows": rows, "notes": notes,
            "failures": failures });
        let text = serde_json::to_string_pretty(&doc)
            .map_err(|e| CliError::Usage(format!("cannot encode JSON: {e}")))?;
        write_file(p, text.as_bytes())?;
    }
    if !failures.is_empty() {
        return Err(CliError::Usage(format!(
            "{} measurements failed (listed above)",
            failures.len()
        )));
    }
    Ok(())
}

impl Mw {
    /// Every figure `runs` times on each transport, alternating which goes first; the MPI
    /// figures come from one job per transport and run (all sizes in one job).
    fn measure_all(&self, rows: &mut [MwRow], runs: usize, failures: &mut Vec<String>) {
        let ucx: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].metric.stack == Stack::Ucx)
            .collect();
        let has_mpi = rows.iter().any(|r| r.metric.stack == Stack::Mpi);
        let steps = ucx.len() * runs * 2 + if has_mpi { runs * 2 } else { 0 };
        let started = Instant::now();
        let progress = ProgressLine::start(steps);
        let mut k = 0;
        let mut iters = std::collections::HashMap::new();
        for &i in &ucx {
            for run in 0..runs {
                for via in order(run) {
                    let m = rows[i].metric;
                    progress.set(k, &format!("{} over {}", m.label(), via.name()), started);
                    k += 1;
                    let n = iters
                        .entry((i, via))
                        .or_insert_with(|| first_iters(m, self.duration));
                    match self.ucx(m, via, *n) {
                        Ok((v, cmd, secs)) => {
                            rows[i].samples(via).push(v, cmd);
                            // The next run of this figure aims at `duration` seconds.
                            let scale = (self.duration / secs.max(1e-3)).clamp(0.1, 10.0);
                            *n = ((*n as f64 * scale) as u64).max(100);
                        }
                        Err(e) => failures.push(format!("{} over {}: {e}", m.label(), via.name())),
                    }
                }
            }
        }
        if has_mpi {
            for run in 0..runs {
                for via in order(run) {
                    progress.set(k, &format!("MPI ping-pong over {}", via.name()), started);
                    k += 1;
                    match self.mpi(via) {
                        Ok((figs, cmd)) => {
                            for r in rows.iter_mut().filter(|r| r.metric.stack == Stack::Mpi) {
                                if let Some(&(_, us, mbps)) =
                                    figs.iter().find(|f| f.0 == r.metric.size)
                                {
                                    let v = if r.metric.lat { us } else { mbps };
                                    r.samples(via).push(v, cmd.clone());
                                }
                            }
                        }
                        Err(e) => failures.push(format!("MPI ping-pong over {}: {e}", via.name())),
                    }
                }
            }
        }
        progress.stop();
    }

    /// One `ucx_perftest` pair; the figure and the client's command line.
    /// One `ucx_perftest` pair of `iters` iterations; the figure, the client's command
    /// line and the seconds the iterations took by the client's figures.
    fn ucx(&self, m: Metric, via: Via, iters: u64) -> Result<(f64, String, f64), CliError> {
        let port = free_tcp_port()?;
        let server = Proc::spawn(
            "ucx_perftest server",
            self.ucx_cmd(m, via, self.server_ip, &["-p".into(), port.to_string()]),
        )?;
        wait_listening(port, READY_TIMEOUT)?;
        let args: Vec<String> = [
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            if m.lat { "tag_lat" } else { "tag_bw" },
            "-s",
            &m.size.to_string(),
            "-n",
            &iters.to_string(),
            "-w",
            &(iters / 10).max(10).to_string(),
        ]
        .map(String::from)
        .into();
        let cmd = self.ucx_cmd(m, via, self.client_ip, &args);
        let line = command_line(&cmd);
        let client = Proc::spawn("ucx_perftest client", cmd)?;
        let cf = client.finish(self.deadline())?;
        server.finish(Instant::now() + SLACK)?;
        let (v, per_iter_us) = ucx_final(&cf, m.lat)
            .ok_or_else(|| CliError::peer("ucx_perftest printed no Final line".into()))?;
        // A latency iteration is a round trip; the reported latency is half of it.
        let trips = if m.lat { 2.0 } else { 1.0 };
        Ok((v, line, iters as f64 * per_iter_us * trips / 1e6))
    }

    /// Both ends get the metric's fragment size: the receiver's buffers must hold the
    /// sender's fragments. It is a verbs setting, so TCP runs as it does for UCX's default.
    fn ucx_cmd(&self, m: Metric, via: Via, ip: IpAddr, args: &[String]) -> Command {
        let mut c = Command::new("ucx_perftest");
        c.args(args);
        match via {
            Via::Softhca => {
                c.env("LD_LIBRARY_PATH", &self.dropin)
                    .env("SOFTHCA_ADDR", ip.to_string())
                    .env("UCX_TLS", UCX_TLS_ON_SOFTHCA)
                    .env("UCX_NET_DEVICES", "softhca0:1");
                if m.seg_size > 0 {
                    c.env("UCX_IB_SEG_SIZE", m.seg_size.to_string());
                }
            }
            Via::Tcp => {
                c.env("UCX_TLS", "tcp").env("UCX_NET_DEVICES", "lo");
            }
        }
        c
    }

    /// One mpirun job of two ranks running every MPI size: (size, half round trip us,
    /// MB/s) per size, and the command line.
    #[allow(clippy::type_complexity)]
    fn mpi(&self, via: Via) -> Result<(Vec<(u64, f64, f64)>, String), CliError> {
        let bin = self
            .mpi
            .as_ref()
            .ok_or_else(|| CliError::Usage("no MPI program".into()))?;
        let mut prog: Vec<String> = vec![bin.display().to_string(), self.duration.to_string()];
        prog.extend(
            METRICS
                .iter()
                .filter(|m| m.stack == Stack::Mpi)
                .map(|m| m.size.to_string()),
        );
        // Unbound ranks, like the ucx_perftest processes (mpirun would pin each rank,
        // and with it softhca's datapath thread, to one core).
        let mut args: Vec<String> = ["--bind-to", "none"].map(String::from).into();
        match via {
            Via::Softhca => {
                // One application context per rank, each with its own device address.
                let lib = self.dropin.display().to_string();
                for (i, ip) in [self.server_ip, self.client_ip].into_iter().enumerate() {
                    if i > 0 {
                        args.push(":".into());
                    }
                    args.extend(["-np", "1", "--mca", "pml", "ucx"].map(String::from));
                    for e in [
                        format!("UCX_TLS={UCX_TLS_ON_SOFTHCA},self"),
                        "UCX_NET_DEVICES=softhca0:1".into(),
                        format!("LD_LIBRARY_PATH={lib}"),
                        format!("SOFTHCA_ADDR={ip}"),
                    ] {
                        args.extend(["-x".into(), e]);
                    }
                    args.extend(prog.iter().cloned());
                }
            }
            Via::Tcp => {
                args.extend(
                    [
                        "-np", "2", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                    ]
                    .map(String::from),
                );
                args.extend(["--mca", "btl_tcp_if_include", "lo"].map(String::from));
                args.extend(prog.iter().cloned());
            }
        }
        let mut cmd = Command::new("mpirun");
        cmd.args(&args);
        // Open MPI refuses root without these (CI, containers).
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        let line = command_line(&cmd);
        let f = Proc::spawn("mpirun", cmd)?.finish(self.deadline())?;
        let figs: Vec<(u64, f64, f64)> = f
            .out
            .iter()
            .filter_map(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                (c.first() == Some(&"pingpong") && c.len() == 6).then_some(())?;
                // Bytes, the median half round trip, MB/s (over the mean).
                Some((c[1].parse().ok()?, c[4].parse().ok()?, c[5].parse().ok()?))
            })
            .collect();
        if figs.is_empty() {
            return Err(CliError::peer("the MPI ping-pong printed no result".into()));
        }
        Ok((figs, line))
    }

    fn deadline(&self) -> Instant {
        // Every figure runs about `duration`; a loaded machine may take several times as
        // long, and the MPI job runs three sizes.
        Instant::now() + Duration::from_secs_f64(self.duration * 10.0) + SLACK
    }

    fn notes(&self, runs: usize) -> Vec<String> {
        vec![
            format!(
                "{runs} run(s) per figure, softhca and TCP alternating; median [min-max]; \
                 softhca/TCP is the ratio of the medians (bandwidth: higher is better, \
                 latency: lower is better)"
            ),
            format!(
                "softhca: devices on {} (server) and {} (client) through the drop-in \
                 libibverbs in {}; UCX_TLS={UCX_TLS_ON_SOFTHCA} (MPI: ...,self; UCX's \
                 rc_verbs needs ud_verbs beside it for its wire-up, rc_verbs,self alone \
                 fails with \"no auxiliary transport\") UCX_NET_DEVICES=softhca0:1",
                self.server_ip,
                self.client_ip,
                self.dropin.display()
            ),
            "TCP: UCX_TLS=tcp UCX_NET_DEVICES=lo; Open MPI --mca pml ob1 --mca btl tcp,self \
             --mca btl_tcp_if_include lo"
                .into(),
            "latency: the 50th percentile of the half round trip (ucx_perftest's; \
             mpi_pingpong.c's over its timed loop); MPI MB/s: one direction per mean half \
             round trip"
                .into(),
        ]
    }
}

impl MwRow {
    fn samples(&mut self, via: Via) -> &mut Samples {
        match via {
            Via::Softhca => &mut self.softhca,
            Via::Tcp => &mut self.tcp,
        }
    }
}

impl Samples {
    fn push(&mut self, v: f64, command: String) {
        self.values.push(v);
        self.command = command;
    }
}

/// Iterations of a figure's first run: about `duration` seconds at a slow machine's
/// speed (300 MB/s, 100 us round trips); later runs scale to the time it took.
fn first_iters(m: Metric, duration: f64) -> u64 {
    let per_sec = if m.lat {
        10_000.0
    } else {
        300e6 / m.size as f64
    };
    ((per_sec * duration) as u64).max(100)
}

/// softhca first in even runs, TCP first in odd ones.
fn order(run: usize) -> [Via; 2] {
    if run.is_multiple_of(2) {
        [Via::Softhca, Via::Tcp]
    } else {
        [Via::Tcp, Via::Softhca]
    }
}

/// The figure of a `ucx_perftest` client's "Final:" line (iterations, latency 50th
/// percentile, average, overall; bandwidth average, overall MB/s; message rates):
/// the 50th percentile latency or the overall bandwidth, and the overall microseconds
/// per iteration.
fn ucx_final(f: &Finished, lat: bool) -> Option<(f64, f64)> {
    let line = f
        .out
        .iter()
        .find(|l| l.trim_start().starts_with("Final:"))?;
    let cols: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| cols.get(i)?.parse::<f64>().ok();
    Some((num(if lat { 2 } else { 6 })?, num(4)?))
}

/// Builds the MPI ping-pong, or says in a note why the MPI rows are left out.
fn build_mpi(dir: &Path, notes: &mut Vec<String>) -> Option<PathBuf> {
    for (prog, pkg) in [("mpicc", "libopenmpi-dev"), ("mpirun", "openmpi-bin")] {
        if !on_path(prog) {
            notes.push(format!(
                "MPI rows left out: {prog} not installed (apt-get install {pkg})"
            ));
            return None;
        }
    }
    let (src, bin) = (dir.join("mpi_pingpong.c"), dir.join("mpi_pingpong"));
    let built = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&src, MPI_PINGPONG_C))
        .and_then(|_| {
            Command::new("mpicc")
                .args(["-O2", "-o"])
                .arg(&bin)
                .arg(&src)
                .output()
        });
    match built {
        Ok(o) if o.status.success() => Some(bin),
        Ok(o) => {
            notes.push(format!(
                "MPI rows left out: mpicc failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            None
        }
        Err(e) => {
            notes.push(format!(
                "MPI rows left out: cannot build the MPI program: {e}"
            ));
            None
        }
    }
}

fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// Whether UCX will use softhca0: its device node is a character device we can open.
fn ucx_device_node() -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(UCX_DEVICE_NODE).is_ok_and(|m| m.file_type().is_char_device())
        && std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(UCX_DEVICE_NODE)
            .is_ok()
}

/// `cmd` as a shell line: its environment settings, then program and arguments.
fn command_line(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            let _ = write!(s, "{}={} ", k.to_string_lossy(), v.to_string_lossy());
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        let _ = write!(s, " {}", a.to_string_lossy());
    }
    s
}

/// A figure with three significant digits or so.
fn fig(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The report: the table, the goals, the notes, the commands of the last run.
fn table(rows: &[MwRow], notes: &[String], failures: &[String], runs: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "softhca bench --middleware: UCX and Open MPI over softhca vs TCP ({runs} run{} each)",
        if runs == 1 { "" } else { "s" }
    );
    let w = rows
        .iter()
        .map(|r| r.label.len())
        .max()
        .unwrap_or(0)
        .max(34);
    let _ = writeln!(
        s,
        "{:<w$} {:>22} {:>22} {:>12}  goal",
        "figure", "softhca", "TCP", "softhca/TCP"
    );
    for r in rows {
        let ratio = r.ratio.map_or("-".into(), |x| format!("{x:.2}x"));
        let goal = match (r.metric.goal(), r.ratio) {
            (Some((g, true)), Some(x)) => {
                format!(">= {g:.1}x: {}", if x >= g { "met" } else { "MISSED" })
            }
            (Some((g, false)), Some(x)) => {
                format!("<= {g:.1}x: {}", if x <= g { "met" } else { "MISSED" })
            }
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "{:<w$} {:>22} {:>22} {:>12}  {goal}",
            r.label,
            r.softhca.range(),
            r.tcp.range(),
            ratio
        );
    }
    for n in notes {
        let _ = writeln!(s, "note: {n}");
    }
    let _ = writeln!(
        s,
        "commands (the client's, last run; the MPI program is crates/cli/src/bench/\
         mpi_pingpong.c built with mpicc -O2):"
    );
    let mut shown = std::collections::HashSet::new();
    for r in rows {
        for (via, smp) in [(Via::Softhca, &r.softhca), (Via::Tcp, &r.tcp)] {
            if !smp.command.is_empty() && shown.insert(&smp.command) {
                let what = match r.metric.stack {
                    Stack::Ucx => r.label.clone(),
                    Stack::Mpi => "MPI ping-pong, every size".into(),
                };
                let _ = writeln!(s, "  {what} over {}: {}", via.name(), smp.command);
            }
        }
    }
    for f in failures {
        let _ = writeln!(s, "FAILED: {f}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ucx_final_line_is_read() {
        let f = Finished {
            out: [
                "[thread 0]  1828  0.060  555.054  555.054  112.60  112.60  1802  1802",
                "Final:      2000  0.070  997.669  593.119   62.65  105.38  1002  1686",
            ]
            .map(String::from)
            .into(),
            err: Vec::new(),
            cpu: 0.0,
        };
        assert_eq!(ucx_final(&f, true), Some((0.070, 593.119)));
        assert_eq!(ucx_final(&f, false), Some((105.38, 593.119)));
    }

    #[test]
    fn median_and_range() {
        let mut s = Samples::default();
        for v in [3.0, 1.0, 2.0] {
            s.push(v, String::new());
        }
        assert_eq!(s.median(), Some(2.0));
        assert_eq!(s.range(), "2.00 [1.00-3.00]");
        assert_eq!(Samples::default().range(), "failed");
    }

    #[test]
    fn goals_are_the_issue_s() {
        assert_eq!(Metric::bw(Stack::Ucx, 65536).goal(), Some((1.0, true)));
        assert_eq!(Metric::bw(Stack::Mpi, 1 << 20).goal(), None);
        assert_eq!(Metric::lat(Stack::Mpi).goal(), Some((1.5, false)));
    }
}
