//! What the table reads besides each flow's own figure: when the flow began (from its
//! output, as it comes), the bytes the token bucket sent from then on, and the most
//! goodput each protocol can carry in those bytes.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The Ethernet header: what the token bucket counts of a frame besides its IP packet
/// (no preamble, FCS or gap; see the testbed's `the_shaper_counts_whole_ethernet_frames`).
const ETH: u64 = 14;
const IPV4: u64 = 20;
/// TCP's header with the timestamp option, which Linux sends by default.
const TCP_TIMESTAMPS: u64 = 20 + 12;
/// RoCEv2's headers of every packet besides IP: UDP 8, BTH 12, ICRC 4.
const ROCE: u64 = 8 + 12 + 4;
/// RETH, on every packet of a WRITE: softhca sends each as a WRITE Only for its part
/// (`SOFTHCA_WRITE_SPLIT`, on by default; rxe's First/Middle/Last carry it only on the
/// first, IBTA 9.3.3).
const RETH: u64 = 16;
/// AETH, on the first and the last READ response (IBTA 9.3.6).
const AETH: u64 = 4;

/// The most goodput `test` can reach, as a share of a link whose token bucket counts
/// frames of at most `link_mtu` bytes of IP: TCP fills each segment to its MSS, softhca
/// carries each `msg`-byte message in packets of `pmtu` bytes of payload.
pub fn goodput_ceiling(test: &str, link_mtu: u64, pmtu: u64, msg: u64) -> f64 {
    if test == "tcp" {
        let mss = link_mtu - IPV4 - TCP_TIMESTAMPS;
        return mss as f64 / (link_mtu + ETH) as f64;
    }
    let pkts = msg.div_ceil(pmtu.max(1)).max(1);
    let extra = match test {
        "write" => RETH * pkts,
        "read" => AETH * pkts.min(2),
        _ => 0,
    };
    msg as f64 / (msg + pkts * (ETH + IPV4 + ROCE) + extra) as f64
}

/// A child's output read as it comes, each line with when it came.
pub struct LiveLines {
    rx: Receiver<(Instant, String)>,
    /// The lines so far.
    pub lines: Vec<(Instant, String)>,
}

impl LiveLines {
    pub fn new(r: impl Read + Send + 'static) -> LiveLines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(l) = line else { break };
                if tx.send((Instant::now(), l)).is_err() {
                    break;
                }
            }
        });
        LiveLines {
            rx,
            lines: Vec::new(),
        }
    }

    /// The next line, if one comes before `deadline` (None at the end too).
    pub fn next(&mut self, deadline: Instant) -> Option<(Instant, String)> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(wait) {
            Ok(l) => {
                self.lines.push(l.clone());
                Some(l)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Every line, once the output has ended.
    pub fn all(&mut self) -> String {
        while let Ok(l) = self.rx.recv() {
            self.lines.push(l);
        }
        let mut s = String::new();
        for (_, l) in &self.lines {
            s.push_str(l);
            s.push('\n');
        }
        s
    }
}

/// `progress <unix time> <bytes>` of `softhca perf --progress`.
pub fn progress(line: &str) -> Option<(f64, u64)> {
    let mut w = line.strip_prefix("progress ")?.split_whitespace();
    Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
}

/// The instant of Unix time `unix` (seconds) on this host's clock.
pub fn instant_of(unix: f64) -> Instant {
    let now = (Instant::now(), SystemTime::now());
    let now_unix = now.1.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ago = now_unix.as_secs_f64() - unix;
    if ago >= 0.0 {
        now.0 - Duration::from_secs_f64(ago)
    } else {
        now.0 + Duration::from_secs_f64(-ago)
    }
}

/// softhca's goodput in Gb/s from its progress lines: the bytes completed from the first
/// line (the start, 0 bytes) to the last (the last completion).
pub fn progress_gbps(text: &str) -> Option<f64> {
    let lines: Vec<(f64, u64)> = text.lines().filter_map(progress).collect();
    let (first, last) = (lines.first()?, lines.last()?);
    let secs = last.0 - first.0;
    (secs > 0.0).then(|| (last.1 - first.1) as f64 * 8.0 / secs / 1e9)
}

/// An interval line of iperf3's text output with `-f k`
/// (`[  5]   0.10-0.20   sec  11475 KBytes  940032 Kbits/sec`): start, end (seconds
/// since its test began) and Gb/s. Not the summary lines (`sender`, `receiver`).
pub fn iperf_interval(line: &str) -> Option<(f64, f64, f64)> {
    if line.contains("sender") || line.contains("receiver") {
        return None;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let sec = words.iter().position(|w| *w == "sec")?;
    let (a, b) = words.get(sec.checked_sub(1)?)?.split_once('-')?;
    let rate = words.iter().position(|w| *w == "Kbits/sec")?;
    let kbps: f64 = words.get(rate.checked_sub(1)?)?.parse().ok()?;
    Some((a.parse().ok()?, b.parse().ok()?, kbps / 1e6))
}

/// The path MTU of `softhca perf`'s report (` MTU             : 4096 bytes`).
pub fn perf_mtu(stdout: &str) -> Option<u64> {
    let l = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("MTU "))?;
    l.split_once(':')?.1.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_at_a_9000_byte_link() {
        // 8948 of 9014 bytes; 65536 of 16 × 4154 (+ a RETH each, + two AETHs).
        let c = |t| goodput_ceiling(t, 9000, 4096, 65536);
        assert!((c("tcp") - 8948.0 / 9014.0).abs() < 1e-12);
        assert!((c("send") - 65536.0 / 66464.0).abs() < 1e-12);
        assert!((c("write") - 65536.0 / 66720.0).abs() < 1e-12);
        assert!((c("read") - 65536.0 / 66472.0).abs() < 1e-12);
        assert!((goodput_ceiling("send", 9000, 4096, 1000) - 1000.0 / 1058.0).abs() < 1e-12);
        // Packets of 8704 between softhca devices: 8 of them, a RETH each, two AETHs;
        // SEND and READ above TCP's 8948 / 9014, the WRITE under it.
        let j = |t| goodput_ceiling(t, 9000, 8704, 65536);
        assert!((j("send") - 65536.0 / (65536.0 + 8.0 * 58.0)).abs() < 1e-12);
        assert!((j("write") - 65536.0 / (65536.0 + 8.0 * 74.0)).abs() < 1e-12);
        assert!((j("read") - 65536.0 / (65536.0 + 8.0 * 58.0 + 8.0)).abs() < 1e-12);
        assert!(j("send") > c("tcp") && j("read") > c("tcp") && j("write") < c("tcp"));
    }

    #[test]
    fn reads_the_flows_output() {
        let l = "[  5]   0.10-0.20   sec  11475 KBytes  940032 Kbits/sec";
        assert_eq!(iperf_interval(l), Some((0.1, 0.2, 0.940032)));
        let sum = "[  5]   0.00-5.00   sec  570 MBytes  956000 Kbits/sec                  receiver";
        assert_eq!(iperf_interval(sum), None);
        assert_eq!(iperf_interval("- - - - - - -"), None);
        let text = "progress 100.5 0\ninterval 0.000 0.5 0.9\nprogress 101.5 125000000\n";
        assert_eq!(progress_gbps(text), Some(1.0));
        assert_eq!(perf_mtu(" MTU             : 4096 bytes\n"), Some(4096));
    }
}
