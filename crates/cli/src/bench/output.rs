//! `softhca bench` results: the row type, ratios, the table, and the SVG plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;

use serde::Serialize;

/// One measurement's result. `kind` is one of `softhca_bw`, `softhca_lat`,
/// `softhca_msg_rate`, `tcp_stream`, `tcp_pingpong`, `udp_pingpong`, `udp_pingpong_roce`
/// (the same through softhca's socket setup: GSO pairs [message, ACK] from a connected
/// socket, GRO, cmsgs), `udp_blast`, `udp_blast_icrc` (the same with a RoCEv2 ICRC
/// sealed and checked on every datagram), `perftest_bw`, `perftest_lat` (unmodified
/// perftest through the drop-in library), `softhca_turnaround` (p50: the
/// user-space part of an 8 B SEND turnaround, see [`Turnaround`]).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What was measured.
    pub kind: &'static str,
    /// send, write, read (softhca) or tcp, udp (baselines).
    pub op: &'static str,
    /// Message (datagram) size in bytes.
    pub size: u64,
    /// Queue pairs (1 for baselines).
    pub qps: u32,
    /// Measured wall time.
    pub seconds: f64,
    /// Messages (round trips for ping-pong, datagrams for raw UDP).
    pub messages: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Payload Gb/s (throughput rows).
    pub gbps: Option<f64>,
    /// Messages per second (throughput rows).
    pub msgs_per_sec: Option<f64>,
    /// Median half round trip in µs (latency rows).
    pub lat_us_p50: Option<f64>,
    /// 99th percentile half round trip in µs (latency rows).
    pub lat_us_p99: Option<f64>,
    /// CPU seconds (user + system) of the process that sent the data (ping-pong: client).
    pub cpu_s_sender: f64,
    /// CPU seconds of the process that received the data (ping-pong: server).
    pub cpu_s_receiver: f64,
    /// `cpu_s_sender` per GB (1e9 bytes) of payload moved.
    pub cpu_s_per_gb_sender: Option<f64>,
    /// `cpu_s_receiver` per GB of payload moved.
    pub cpu_s_per_gb_receiver: Option<f64>,
    /// softhca ÷ TCP: Gb/s against TCP stream (bandwidth), p50 against TCP ping-pong
    /// (latency), at the same size.
    pub vs_tcp: Option<f64>,
    /// softhca ÷ raw UDP: Gb/s against the GSO+GRO blast (bandwidth), p50 against UDP
    /// ping-pong (latency).
    pub vs_raw_udp: Option<f64>,
    /// softhca ÷ the RoCEv2 ceiling: Gb/s against the blast with an ICRC on each side
    /// (bandwidth rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_roce_ceiling: Option<f64>,
    /// Raw UDP with ICRC: datagrams whose ICRC did not match at the receiver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icrc_failures: Option<u64>,
    /// Raw UDP and softhca: whether the sender's socket used GSO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gso: Option<bool>,
    /// Raw UDP and softhca: whether the receiver's socket used GRO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gro: Option<bool>,
    /// softhca: the datapath's polling mode (SOFTHCA_POLL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll: Option<String>,
    /// softhca turnaround rows: the median of each phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turnaround_p50_us: Option<Turnaround>,
    /// Anything the reader should know about this row.
    pub note: Option<String>,
}

/// The phases of a softhca device's turnarounds (datagrams received → the application
/// takes a completion → it posts → the answer goes to the kernel → `sendmmsg` returns),
/// median µs each, from the line `SOFTHCA_STATS` prints (`softhca::turnaround`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Turnaround {
    /// Turnarounds timed.
    pub count: u64,
    /// The datapath step that received: the engine's work and the CQ.
    pub receive_to_taken: f64,
    /// The application, from its completion to its next post.
    pub taken_to_post: f64,
    /// The post: building and sealing the answer (and the ACK it carries).
    pub post_to_send: f64,
    /// The `sendmmsg` system call.
    pub send: f64,
}

impl Turnaround {
    /// Reads `softhca: turnarounds=N p50/p99 us: receive->taken A/a, taken->post B/b,
    /// post->send C/c, send D/d`; None for any other line.
    pub fn parse(line: &str) -> Option<Turnaround> {
        let rest = line.split_once("turnarounds=")?.1;
        let (count, rest) = rest.split_once(' ')?;
        let phases = rest.split_once("us: ")?.1;
        let p50 = |name: &str| -> Option<f64> {
            let part = phases
                .split(", ")
                .find_map(|p| p.strip_prefix(name)?.strip_prefix(' '))?;
            part.split('/').next()?.trim().parse().ok()
        };
        Some(Turnaround {
            count: count.parse().ok()?,
            receive_to_taken: p50("receive->taken")?,
            taken_to_post: p50("taken->post")?,
            post_to_send: p50("post->send")?,
            send: p50("send")?,
        })
    }

    /// softhca's own share of a half round trip: the user-space phases.
    pub fn user_space(&self) -> f64 {
        self.receive_to_taken + self.taken_to_post + self.post_to_send
    }
}

impl Row {
    /// A row with the common fields set and the kind-specific ones empty.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: &'static str,
        op: &'static str,
        size: u64,
        qps: u32,
        seconds: f64,
        messages: u64,
        bytes: u64,
        cpu_s_sender: f64,
        cpu_s_receiver: f64,
    ) -> Row {
        let per_gb = |cpu: f64| (bytes > 0).then(|| cpu / (bytes as f64 / 1e9));
        Row {
            kind,
            op,
            size,
            qps,
            seconds,
            messages,
            bytes,
            gbps: None,
            msgs_per_sec: None,
            lat_us_p50: None,
            lat_us_p99: None,
            cpu_s_sender,
            cpu_s_receiver,
            cpu_s_per_gb_sender: per_gb(cpu_s_sender),
            cpu_s_per_gb_receiver: per_gb(cpu_s_receiver),
            vs_tcp: None,
            vs_raw_udp: None,
            vs_roce_ceiling: None,
            icrc_failures: None,
            gso: None,
            gro: None,
            poll: None,
            turnaround_p50_us: None,
            note: None,
        }
    }

    /// Fills `gbps` and `msgs_per_sec` from bytes, messages and seconds.
    pub fn set_throughput(&mut self) {
        if self.seconds > 0.0 {
            self.gbps = Some(self.bytes as f64 * 8.0 / self.seconds / 1e9);
            self.msgs_per_sec = Some(self.messages as f64 / self.seconds);
        }
    }
}

/// Everything one `softhca bench` run produced (also the JSON document).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Seconds each measurement ran.
    pub duration_per_point: f64,
    /// `--quick` run.
    pub quick: bool,
    /// Wall time of the whole run.
    pub total_seconds: f64,
    /// The softhca server device's address.
    pub server_addr: String,
    /// The softhca client device's address.
    pub client_addr: String,
    /// Resident bytes per idle connected RC QP (1-entry rings), when measured.
    pub idle_qp_bytes: Option<f64>,
    /// What a system call and the ICRC cost on this host.
    pub host: softhca_perf::host::HostCosts,
    /// Results.
    pub rows: Vec<Row>,
    /// Remarks printed under the table.
    pub notes: Vec<String>,
    /// Measurements that failed, with why.
    pub failures: Vec<String>,
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Sets `vs_tcp` and `vs_raw_udp` on softhca rows from the baseline rows of the run.
pub fn add_ratios(rows: &mut [Row]) {
    let by = |kind: &str| -> BTreeMap<u64, &Row> {
        rows.iter()
            .filter(|r| r.kind == kind)
            .map(|r| (r.size, r))
            .collect()
    };
    let tcp_bw: BTreeMap<u64, Option<f64>> = by("tcp_stream")
        .into_iter()
        .map(|(s, r)| (s, r.gbps))
        .collect();
    let tcp_lat: BTreeMap<u64, Option<f64>> = by("tcp_pingpong")
        .into_iter()
        .map(|(s, r)| (s, r.lat_us_p50))
        .collect();
    let udp_lat: BTreeMap<u64, Option<f64>> = by("udp_pingpong")
        .into_iter()
        .map(|(s, r)| (s, r.lat_us_p50))
        .collect();
    let gbps = |kind: &str| rows.iter().find(|r| r.kind == kind).and_then(|r| r.gbps);
    let (blast, ceiling) = (gbps("udp_blast"), gbps("udp_blast_icrc"));
    for r in rows.iter_mut() {
        match r.kind {
            "softhca_bw" | "softhca_bw_shared" | "perftest_bw" => {
                r.vs_tcp = ratio(r.gbps, tcp_bw.get(&r.size).copied().flatten());
                r.vs_raw_udp = ratio(r.gbps, blast);
                r.vs_roce_ceiling = ratio(r.gbps, ceiling);
            }
            "softhca_lat" | "perftest_lat" => {
                r.vs_tcp = ratio(r.lat_us_p50, tcp_lat.get(&r.size).copied().flatten());
                r.vs_raw_udp = ratio(r.lat_us_p50, udp_lat.get(&r.size).copied().flatten());
            }
            _ => {}
        }
    }
}

/// `8 B`, `64 B`, `4K`, `64K`, `1M`.
pub fn size_str(n: u64) -> String {
    if n >= 1 << 20 && n & ((1 << 20) - 1) == 0 {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n & ((1 << 10) - 1) == 0 {
        format!("{}K", n >> 10)
    } else {
        format!("{n} B")
    }
}

const RULE: &str = "------------------------------------------------------------------------------------------------------------------";

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

/// The human-readable table with notes and failures.
pub fn print_table(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    writeln!(
        out,
        "softhca bench: loopback, two processes per measurement ({} / {} for softhca), {} s each, {:.0} s in all",
        r.server_addr, r.client_addr, r.duration_per_point, r.total_seconds
    )?;
    writeln!(out, "{RULE}")?;
    writeln!(
        out,
        " {:<18} {:<5} {:>5} {:>3} {:>9} {:>10} {:>8} {:>8} {:>6} {:>7} {:>9} {:>9}",
        "test",
        "op",
        "size",
        "QPs",
        "Gb/s",
        "msg/s",
        "p50[us]",
        "p99[us]",
        "/TCP",
        "/rawUDP",
        "CPUs/GB tx",
        "rx"
    )?;
    writeln!(out, "{RULE}")?;
    let mut last_kind = "";
    for row in &r.rows {
        if !last_kind.is_empty() && row.kind != last_kind {
            writeln!(out)?;
        }
        last_kind = row.kind;
        let test = match row.kind {
            "softhca_bw" => "softhca bandwidth",
            "softhca_bw_shared" => "softhca bw, 1 buf",
            "softhca_lat" => "softhca latency",
            "softhca_msg_rate" => "softhca msg rate",
            "softhca_turnaround" => "softhca turnaround",
            "tcp_stream" => "TCP stream",
            "tcp_pingpong" => "TCP ping-pong",
            "udp_pingpong" => "UDP ping-pong",
            "udp_pingpong_roce" => "UDP, softhca's sockets",
            "udp_blast" => "raw UDP GSO+GRO",
            "udp_blast_icrc" => "raw UDP + ICRC",
            "perftest_bw" | "perftest_lat" => "perftest drop-in",
            k => k,
        };
        let latency = row.lat_us_p50.is_some();
        writeln!(
            out,
            " {:<18} {:<5} {:>5} {:>3} {:>9} {:>10} {:>8} {:>8} {:>6} {:>7} {:>10} {:>9}",
            test,
            row.op,
            size_str(row.size),
            row.qps,
            opt(row.gbps, 2),
            row.msgs_per_sec
                .map_or_else(|| "-".into(), |m| format!("{m:.0}")),
            opt(row.lat_us_p50, 2),
            opt(row.lat_us_p99, 2),
            opt(row.vs_tcp, 2),
            opt(row.vs_raw_udp, 2),
            if latency {
                "-".into()
            } else {
                opt(row.cpu_s_per_gb_sender, 2)
            },
            if latency {
                "-".into()
            } else {
                opt(row.cpu_s_per_gb_receiver, 2)
            },
        )?;
    }
    writeln!(out, "{RULE}")?;
    for n in &r.notes {
        writeln!(out, " note: {n}")?;
    }
    for f in &r.failures {
        writeln!(out, " FAILED: {f}")?;
    }
    Ok(())
}

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A tick step of 1, 2 or 5 × 10^k giving about five ticks up to `max`.
fn tick_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let m = raw / mag;
    let f = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * mag
}

/// A plotted line: label, colour, dashed, (size, Gb/s) points.
type Series = (String, &'static str, bool, Vec<(u64, f64)>);

/// The lines of the plot: one per softhca op and QP count (2 QPs dashed) and the TCP
/// stream; with the raw UDP ceiling, drawn as a horizontal line.
fn plot_series(r: &Report) -> (Vec<Series>, Option<f64>) {
    let points = |keep: &dyn Fn(&Row) -> bool| {
        let mut pts: Vec<(u64, f64)> = r
            .rows
            .iter()
            .filter(|x| keep(x))
            .filter_map(|x| x.gbps.map(|g| (x.size, g)))
            .collect();
        pts.sort_by_key(|p| p.0);
        pts
    };
    let mut series: Vec<Series> = Vec::new();
    for (op, colour) in [
        ("send", "#1f77b4"),
        ("write", "#d62728"),
        ("read", "#2ca02c"),
    ] {
        for qps in [1u32, 2] {
            let pts = points(&|x| x.kind == "softhca_bw" && x.op == op && x.qps == qps);
            if !pts.is_empty() {
                series.push((format!("softhca {op}, {qps} QP"), colour, qps > 1, pts));
            }
        }
    }
    let tcp = points(&|x| x.kind == "tcp_stream");
    if !tcp.is_empty() {
        series.push(("TCP stream".into(), "#555555", false, tcp));
    }
    let blast = r
        .rows
        .iter()
        .find(|x| x.kind == "udp_blast")
        .and_then(|x| x.gbps);
    (series, blast)
}

/// The plot area and its scales: log2 of the size across, Gb/s up.
struct Plot {
    w: f64,
    h: f64,
    left: f64,
    top: f64,
    pw: f64,
    ph: f64,
    x0: f64,
    x1: f64,
    ymax: f64,
    step: f64,
}

impl Plot {
    fn new(series: &[Series], blast: Option<f64>) -> Plot {
        let (w, h) = (860.0f64, 520.0f64);
        let (left, right, top, bottom) = (70.0, 220.0, 40.0, 60.0);
        let lgs: Vec<f64> = series
            .iter()
            .flat_map(|s| s.3.iter().map(|p| lg(p.0)))
            .collect();
        let mut x0 = lgs.iter().copied().fold(f64::INFINITY, f64::min);
        let mut x1 = lgs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !x0.is_finite() {
            (x0, x1) = (12.0, 20.0);
        }
        if x1 - x0 < 1.0 {
            x0 -= 1.0;
            x1 += 1.0;
        }
        let ymax_data = series
            .iter()
            .flat_map(|s| s.3.iter().map(|p| p.1))
            .chain(blast)
            .fold(0.0f64, f64::max)
            .max(0.1);
        let step = tick_step(ymax_data * 1.05);
        Plot {
            w,
            h,
            left,
            top,
            pw: w - left - right,
            ph: h - top - bottom,
            x0,
            x1,
            ymax: (ymax_data * 1.05 / step).ceil() * step,
            step,
        }
    }

    fn px(&self, size: u64) -> f64 {
        self.left + (lg(size) - self.x0) / (self.x1 - self.x0) * self.pw
    }

    fn py(&self, gbps: f64) -> f64 {
        self.top + self.ph - gbps / self.ymax * self.ph
    }

    /// Title, grid, ticks and axis labels.
    fn axes(&self, o: &mut String, seconds: f64) {
        let Plot {
            w,
            h,
            left,
            top,
            pw,
            ph,
            ..
        } = *self;
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            o,
            r#"<text x="{}" y="22" font-size="15" text-anchor="middle">softhca bench: bandwidth vs message size (loopback, {seconds} s per point)</text>"#,
            left + pw / 2.0,
        );
        let mut g = 0.0;
        while g <= self.ymax + self.step / 2.0 {
            let y = self.py(g);
            let label = if self.step < 1.0 {
                format!("{g:.1}")
            } else {
                format!("{g:.0}")
            };
            let _ = writeln!(
                o,
                r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
                left + pw,
                left - 6.0,
                y + 4.0,
            );
            g += self.step;
        }
        let mut k = self.x0.ceil() as i32;
        while f64::from(k) <= self.x1 {
            let s = 1u64 << k.clamp(0, 62);
            let x = self.px(s);
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#f0f0f0"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                top + ph,
                top + ph + 18.0,
                esc(&size_str(s))
            );
            k += 1;
        }
        let _ = writeln!(
            o,
            r#"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">message size (bytes, log scale)</text>"#,
            left + pw / 2.0,
            h - 15.0
        );
        let mid = top + ph / 2.0;
        let _ = writeln!(
            o,
            r#"<text x="18" y="{mid:.1}" text-anchor="middle" transform="rotate(-90 18 {mid:.1})">Gb/s (payload)</text>"#,
        );
    }

    /// The lines, the ceiling and the legend.
    fn data(&self, o: &mut String, series: &[Series], blast: Option<f64>) {
        let mut legend: Vec<(String, &str, &str)> = Vec::new();
        for (label, colour, dashed, pts) in series {
            let dash = if *dashed { "6,4" } else { "none" };
            let path: Vec<String> = pts
                .iter()
                .map(|&(s, g)| format!("{:.1},{:.1}", self.px(s), self.py(g)))
                .collect();
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
                path.join(" ")
            );
            for &(s, g) in pts {
                let (cx, cy) = (self.px(s), self.py(g));
                let _ = writeln!(
                    o,
                    r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="3" fill="{colour}"/>"#
                );
            }
            legend.push((label.clone(), colour, dash));
        }
        let right_edge = self.left + self.pw;
        if let Some(b) = blast {
            let (left, y) = (self.left, self.py(b));
            let _ = writeln!(
                o,
                r##"<line x1="{left}" y1="{y:.1}" x2="{right_edge:.1}" y2="{y:.1}" stroke="#ff7f0e" stroke-width="2" stroke-dasharray="2,3"/>"##,
            );
            legend.push(("raw UDP GSO+GRO (4K datagrams)".into(), "#ff7f0e", "2,3"));
        }
        for (i, (label, colour, dash)) in legend.iter().enumerate() {
            let y = self.top + 10.0 + i as f64 * 20.0;
            let x = right_edge + 12.0;
            let _ = writeln!(
                o,
                r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                x + 24.0,
                x + 30.0,
                y + 4.0,
                esc(label)
            );
        }
    }
}

fn lg(size: u64) -> f64 {
    (size.max(1) as f64).log2()
}

/// Bandwidth (Gb/s) against message size (log scale): one line per softhca op and QP
/// count (2 QPs dashed), TCP stream, and raw UDP as a horizontal line.
pub fn svg(r: &Report) -> String {
    let (series, blast) = plot_series(r);
    let plot = Plot::new(&series, blast);
    let mut o = String::new();
    plot.axes(&mut o, r.duration_per_point);
    plot.data(&mut o, &series, blast);
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn turnaround_line_parses() {
        let line = "softhca: turnarounds=79682 p50/p99 us: receive->taken 1.56/11.26, \
                    taken->post 0.31/0.91, post->send 0.89/1.86, send 6.21/25.59";
        let t = Turnaround::parse(line).unwrap();
        assert_eq!(t.count, 79682);
        assert_eq!(
            (t.receive_to_taken, t.taken_to_post, t.post_to_send, t.send),
            (1.56, 0.31, 0.89, 6.21)
        );
        assert!((t.user_space() - 2.76).abs() < 1e-9);
        assert!(Turnaround::parse("softhca: counters at close: sent_pkts=2").is_none());
        assert!(Turnaround::parse("softhca: turnarounds=3 p50/p99 us: send 1/2").is_none());
    }

    use super::*;

    fn bw(kind: &'static str, op: &'static str, size: u64, gbps: f64) -> Row {
        let mut r = Row::new(
            kind,
            op,
            size,
            1,
            1.0,
            1,
            (gbps * 1e9 / 8.0) as u64,
            1.0,
            2.0,
        );
        r.set_throughput();
        r
    }

    #[test]
    fn ratios_match_sizes() {
        let mut rows = vec![
            bw("tcp_stream", "tcp", 65536, 20.0),
            bw("udp_blast", "udp", 4096, 40.0),
            bw("softhca_bw", "write", 65536, 10.0),
            bw("softhca_bw", "write", 4096, 5.0),
        ];
        add_ratios(&mut rows);
        assert!((rows[2].vs_tcp.unwrap() - 0.5).abs() < 1e-6);
        assert!((rows[2].vs_raw_udp.unwrap() - 0.25).abs() < 1e-6);
        // No TCP point at 4K: no ratio rather than a wrong one.
        assert_eq!(rows[3].vs_tcp, None);
        // 10 Gb/s for 1 s is 1.25 GB; 1 CPU second on the sender.
        assert!((rows[2].cpu_s_per_gb_sender.unwrap() - 0.8).abs() < 1e-3);
    }

    #[test]
    fn svg_has_series() {
        let r = Report {
            duration_per_point: 1.0,
            quick: true,
            total_seconds: 1.0,
            server_addr: "a".into(),
            client_addr: "b".into(),
            idle_qp_bytes: None,
            host: softhca_perf::host::HostCosts {
                cpu: None,
                syscall_us: 0.1,
                icrc_gbps: 10.0,
            },
            rows: vec![
                bw("tcp_stream", "tcp", 65536, 20.0),
                bw("udp_blast", "udp", 4096, 40.0),
                bw("softhca_bw", "write", 65536, 10.0),
            ],
            notes: vec![],
            failures: vec![],
        };
        let s = svg(&r);
        assert!(s.starts_with("<svg"));
        assert!(s.contains("softhca write, 1 QP"));
        assert!(s.contains("TCP stream"));
        assert!(s.contains("raw UDP"));
        assert!(s.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn sizes() {
        assert_eq!(size_str(8), "8 B");
        assert_eq!(size_str(4096), "4K");
        assert_eq!(size_str(1 << 20), "1M");
    }
}
