//! The typed result of one test: its statistics and the JSON line `--json` prints.

use serde::Serialize;

/// Bandwidth or latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Streaming with `tx_depth` outstanding work requests.
    Bw,
    /// Ping-pong (SEND, WRITE) or one outstanding request (READ, atomic).
    Lat,
}

impl Mode {
    /// "bw" or "lat".
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Bw => "bw",
            Mode::Lat => "lat",
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatStats {
    /// Minimum.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
}

impl LatStats {
    /// Statistics of samples given in nanoseconds, each scaled by `scale`
    /// (0.5 reports half a round trip, as perftest's send_lat and write_lat do).
    pub fn from_ns(samples: &mut [u64], scale: f64) -> LatStats {
        if samples.is_empty() {
            return LatStats::default();
        }
        samples.sort_unstable();
        let us = |ns: u64| ns as f64 * scale / 1000.0;
        let n = samples.len();
        let pct = |p: f64| {
            let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            us(samples[idx])
        };
        let avg = samples.iter().map(|&s| us(s)).sum::<f64>() / n as f64;
        let var = samples.iter().map(|&s| (us(s) - avg).powi(2)).sum::<f64>() / n as f64;
        LatStats {
            min: us(samples[0]),
            p50: pct(0.5),
            p99: pct(0.99),
            p999: pct(0.999),
            max: us(samples[n - 1]),
            avg,
            stdev: var.sqrt(),
        }
    }
}

/// One benchmark result.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfResult {
    /// send, write, read or atomic.
    pub op: &'static str,
    /// bw or lat.
    pub mode: Mode,
    /// Message size in bytes.
    pub size: u64,
    /// Messages completed (all QPs).
    pub iters: u64,
    /// Number of QPs.
    pub qps: u32,
    /// Path MTU both sides agreed on.
    pub mtu: u32,
    /// Wall time of the measured phase.
    pub seconds: f64,
    /// Latency statistics (latency mode).
    pub lat: Option<LatStats>,
    /// `Some(true)` when `--verify` checked every byte and all matched.
    pub verified: Option<bool>,
}

impl PerfResult {
    /// Payload gigabits per second.
    pub fn gbps(&self) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        (self.iters as f64 * self.size as f64 * 8.0) / self.seconds / 1e9
    }

    /// Million messages per second.
    pub fn mpps(&self) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        self.iters as f64 / self.seconds / 1e6
    }

    /// The JSON object printed by `--json` (one per line).
    pub fn to_json(&self) -> serde_json::Value {
        let r3 = |v: f64| (v * 1000.0).round() / 1000.0;
        let mut o = serde_json::json!({
            "op": self.op,
            "mode": self.mode.as_str(),
            "size": self.size,
            "iters": self.iters,
            "qps": self.qps,
            "mtu": self.mtu,
            "seconds": r3(self.seconds * 1000.0) / 1000.0,
            "gbps": r3(self.gbps()),
            "mpps": (self.mpps() * 1e6).round() / 1e6,
            "verified": self.verified.unwrap_or(false),
        });
        if let (Some(l), Some(map)) = (self.lat, o.as_object_mut()) {
            for (k, v) in [
                ("lat_us_min", l.min),
                ("lat_us_p50", l.p50),
                ("lat_us_p99", l.p99),
                ("lat_us_p999", l.p999),
                ("lat_us_max", l.max),
                ("lat_us_avg", l.avg),
                ("lat_us_stdev", l.stdev),
            ] {
                map.insert(k.into(), serde_json::json!(r3(v)));
            }
        }
        o
    }

    /// perftest's name for the test ("RDMA_Write BW Test").
    pub fn title(&self) -> String {
        let op = match self.op {
            "send" => "Send",
            "write" => "RDMA_Write",
            "read" => "RDMA_Read",
            "atomic" => "Atomic FETCH_AND_ADD",
            o => o,
        };
        let mode = match self.mode {
            Mode::Bw => "BW",
            Mode::Lat => "Latency",
        };
        format!("{op} {mode} Test")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut s: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let l = LatStats::from_ns(&mut s, 1.0);
        assert_eq!(l.min, 1.0);
        assert_eq!(l.p50, 50.0);
        assert_eq!(l.p99, 99.0);
        assert_eq!(l.max, 100.0);
        assert!((l.avg - 50.5).abs() < 1e-9);
        let half = LatStats::from_ns(&mut s, 0.5);
        assert_eq!(half.p50, 25.0);
    }

    #[test]
    fn json_fields() {
        let r = PerfResult {
            op: "write",
            mode: Mode::Bw,
            size: 65536,
            iters: 1000,
            qps: 1,
            mtu: 4096,
            seconds: 0.5,
            lat: None,
            verified: Some(true),
        };
        let j = r.to_json();
        assert_eq!(j["op"], "write");
        assert_eq!(j["iters"], 1000);
        assert_eq!(j["verified"], true);
        assert!((j["gbps"].as_f64().unwrap() - 1.049).abs() < 0.001);
        assert!(j.get("lat_us_p50").is_none());
    }
}
