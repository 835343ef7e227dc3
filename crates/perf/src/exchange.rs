//! The TCP connection exchange, as perftest does it before any RDMA traffic.
//!
//! The client sends the test parameters and, per QP, {qpn, psn, gid, rkey, va, mr len};
//! the server answers with its own QP lines once its QPs are ready to receive, then the
//! client starts. The same connection carries WRITE-verify credits and the end-of-test
//! summary. Everything is one text line per message, so a mismatch is easy to debug
//! with `nc`.

use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use softhca::Gid;

use crate::error::PerfError;

/// Default TCP port (perftest's).
pub const DEFAULT_PORT: u16 = 18515;

/// Version tag of the exchange, so an old peer fails with a clear message.
const HELLO: &str = "SOFTHCA-PERF/1";

/// One QP's connection data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// Queue pair number.
    pub qpn: u32,
    /// First PSN the QP sends.
    pub psn: u32,
    /// The GID (IP address) the QP sends from.
    pub gid: Gid,
    /// Remote key of the QP's buffer.
    pub rkey: u32,
    /// Virtual address (iova) of the buffer.
    pub va: u64,
    /// Length of the buffer.
    pub len: u64,
}

impl QpInfo {
    fn to_line(self) -> String {
        let gid: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "qp {:06x} {:06x} {} {:08x} {:016x} {:x}",
            self.qpn, self.psn, gid, self.rkey, self.va, self.len
        )
    }

    fn parse(line: &str) -> Option<QpInfo> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 7 || f[0] != "qp" || f[3].len() != 32 {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(f[3].get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(QpInfo {
            qpn: u32::from_str_radix(f[1], 16).ok()?,
            psn: u32::from_str_radix(f[2], 16).ok()?,
            gid: Gid(gid),
            rkey: u32::from_str_radix(f[4], 16).ok()?,
            va: u64::from_str_radix(f[5], 16).ok()?,
            len: u64::from_str_radix(f[6], 16).ok()?,
        })
    }
}

/// What the client asks the server to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestParams {
    /// send, write, read, atomic, or quit (ends a `perf all` server).
    pub op: String,
    /// bw or lat.
    pub lat: bool,
    /// Message size.
    pub size: u64,
    /// Messages per QP (0 with a duration).
    pub iters: u64,
    /// Duration in milliseconds (0 with an iteration count).
    pub duration_ms: u64,
    /// Number of QPs.
    pub qps: u32,
    /// Outstanding WRs per QP.
    pub tx_depth: u32,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// `--verify`.
    pub verify: bool,
    /// Buffer slots per QP (set by the client from size, depth and verify).
    pub slots: u32,
    /// `--shared-buffer`: every QP uses the first QP's slots.
    pub shared: bool,
    /// `--events`: this side sleeps until a completion instead of spinning on its CQs
    /// (each side's own choice, not sent to the peer).
    pub events: bool,
}

impl TestParams {
    fn to_line(&self) -> String {
        format!(
            "{HELLO} op={} lat={} size={} iters={} dur_ms={} qps={} txd={} mtu={} verify={} slots={} shared={}",
            self.op,
            u8::from(self.lat),
            self.size,
            self.iters,
            self.duration_ms,
            self.qps,
            self.tx_depth,
            self.mtu,
            u8::from(self.verify),
            self.slots,
            u8::from(self.shared)
        )
    }

    fn parse(line: &str) -> Result<TestParams, String> {
        let mut it = line.split_whitespace();
        if it.next() != Some(HELLO) {
            return Err(format!(
                "not a softhca perf client (got '{}')",
                line.chars().take(40).collect::<String>()
            ));
        }
        let mut p = TestParams {
            op: String::new(),
            lat: false,
            size: 0,
            iters: 0,
            duration_ms: 0,
            qps: 1,
            tx_depth: 1,
            mtu: 1024,
            verify: false,
            slots: 1,
            shared: false,
            events: false,
        };
        for kv in it {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("bad field '{kv}'"))?;
            let num = || v.parse::<u64>().map_err(|_| format!("bad value in '{kv}'"));
            let small = || v.parse::<u32>().map_err(|_| format!("bad value in '{kv}'"));
            match k {
                "op" => p.op = v.to_string(),
                "lat" => p.lat = num()? != 0,
                "size" => p.size = num()?,
                "iters" => p.iters = num()?,
                "dur_ms" => p.duration_ms = num()?,
                "qps" => p.qps = small()?,
                "txd" => p.tx_depth = small()?,
                "mtu" => p.mtu = small()?,
                "verify" => p.verify = num()? != 0,
                "slots" => p.slots = small()?,
                "shared" => p.shared = num()? != 0,
                _ => {} // later versions may add fields
            }
        }
        Ok(p)
    }
}

/// A control message after set-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ctl {
    /// Server → client: QP `qp` has verified messages `< count` (WRITE verify flow control).
    Credit {
        /// QP index.
        qp: u32,
        /// Messages verified.
        count: u64,
    },
    /// Client → server: the client is done; per-QP message counts it sent.
    End(Vec<u64>),
    /// Server → client: the server's verdict (`true` = all data verified or nothing to verify).
    Verdict(bool, String),
    /// Either way: the sender failed with this message.
    Error(String),
}

impl Ctl {
    fn to_line(&self) -> String {
        match self {
            Ctl::Credit { qp, count } => format!("credit {qp} {count}"),
            Ctl::End(c) => {
                let v: Vec<String> = c.iter().map(|n| n.to_string()).collect();
                format!("end {}", v.join(" "))
            }
            Ctl::Verdict(ok, msg) => format!("verdict {} {}", u8::from(*ok), one_line(msg)),
            Ctl::Error(m) => format!("error {}", one_line(m)),
        }
    }

    fn parse(line: &str) -> Option<Ctl> {
        let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
        match head {
            "credit" => {
                let (a, b) = rest.split_once(' ')?;
                Some(Ctl::Credit {
                    qp: a.parse().ok()?,
                    count: b.trim().parse().ok()?,
                })
            }
            "end" => rest
                .split_whitespace()
                .map(|s| s.parse().ok())
                .collect::<Option<Vec<u64>>>()
                .map(Ctl::End),
            "verdict" => {
                let (a, m) = rest.split_once(' ').unwrap_or((rest, ""));
                Some(Ctl::Verdict(a == "1", m.to_string()))
            }
            "error" => Some(Ctl::Error(rest.to_string())),
            _ => None,
        }
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The TCP control connection.
pub struct Control {
    peer: String,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    partial: String,
}

/// How long set-up may take before we give up on the peer.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

impl Control {
    /// Connects to a server; `addr` is `host` or `host:port`.
    pub fn connect(host: &str, port: u16) -> Result<(Control, SocketAddr), PerfError> {
        let display = if host.contains(':')
            && !host.starts_with('[')
            && host.parse::<std::net::Ipv6Addr>().is_ok()
        {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|_| PerfError::Resolve(host.to_string()))?
            .collect();
        let mut last = io::Error::new(ErrorKind::NotFound, "no address");
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => return Ok((Control::new(s, display)?, *a)),
                Err(e) => last = e,
            }
        }
        Err(PerfError::Connect {
            addr: display,
            source: last,
        })
    }

    /// Wraps an accepted connection.
    pub fn new(stream: TcpStream, peer: String) -> Result<Control, PerfError> {
        let _ = stream.set_nodelay(true);
        let writer = stream
            .try_clone()
            .map_err(|e| PerfError::exchange(&peer, e))?;
        stream
            .set_read_timeout(Some(SETUP_TIMEOUT))
            .map_err(|e| PerfError::exchange(&peer, e))?;
        Ok(Control {
            peer,
            reader: BufReader::new(stream),
            writer,
            partial: String::new(),
        })
    }

    /// The peer's name for messages.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    fn err(&self, e: impl ToString) -> PerfError {
        PerfError::exchange(&self.peer, e)
    }

    fn send_line(&mut self, line: &str) -> Result<(), PerfError> {
        let mut l = String::with_capacity(line.len() + 1);
        l.push_str(line);
        l.push('\n');
        self.writer
            .write_all(l.as_bytes())
            .map_err(|e| PerfError::exchange(&self.peer, crate::error::io_msg(&e)))
    }

    /// Reads one line, waiting up to `timeout` (None = forever). `Ok(None)` on timeout.
    fn read_line(&mut self, timeout: Option<Duration>) -> Result<Option<String>, PerfError> {
        let whole_line_buffered = self.reader.buffer().contains(&b'\n');
        if let Some(d) = timeout.filter(|_| !whole_line_buffered) {
            // The socket's read timeout is no short wait: Linux rounds it up to whole
            // clock ticks, and a 1 µs or 200 µs one blocked 8 ms here (a bandwidth
            // client waiting for credits stalled its polling that long).
            if !readable(self.reader.get_ref(), d).map_err(|e| self.err(e))? {
                return Ok(None);
            }
        }
        let t = match timeout {
            Some(d) if d.is_zero() => Some(Duration::from_micros(1)),
            t => t,
        };
        self.reader
            .get_ref()
            .set_read_timeout(t)
            .map_err(|e| self.err(e))?;
        match self.reader.read_line(&mut self.partial) {
            Ok(0) => Err(self.err("connection closed by peer")),
            Ok(_) if self.partial.ends_with('\n') => {
                let line = std::mem::take(&mut self.partial);
                Ok(Some(line.trim_end().to_string()))
            }
            Ok(_) => Err(self.err("connection closed by peer")),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(self.err(crate::error::io_msg(&e))),
        }
    }

    fn expect_line(&mut self, what: &str) -> Result<String, PerfError> {
        match self.read_line(Some(SETUP_TIMEOUT))? {
            Some(l) => Ok(l),
            None => Err(self.err(format!("no {what} within {} s", SETUP_TIMEOUT.as_secs()))),
        }
    }

    /// Client: sends the parameters and the client's QPs.
    pub fn send_request(&mut self, p: &TestParams, qps: &[QpInfo]) -> Result<(), PerfError> {
        self.send_line(&p.to_line())?;
        for q in qps {
            self.send_line(&q.to_line())?;
        }
        Ok(())
    }

    /// Server: reads the parameters (the QP lines follow; see [`Control::recv_qps`]).
    pub fn recv_params(&mut self) -> Result<TestParams, PerfError> {
        let l = self.expect_line("test parameters")?;
        TestParams::parse(&l).map_err(|e| self.err(e))
    }

    /// Reads `n` QP lines (or an `error` line from the peer).
    pub fn recv_qps(&mut self, n: u32) -> Result<Vec<QpInfo>, PerfError> {
        let mut v = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let l = self.expect_line("QP data")?;
            if let Some(Ctl::Error(m)) = Ctl::parse(&l) {
                return Err(PerfError::Peer(m));
            }
            v.push(QpInfo::parse(&l).ok_or_else(|| self.err(format!("bad QP line '{l}'")))?);
        }
        Ok(v)
    }

    /// Server: sends its QPs (its side is ready to receive).
    pub fn send_qps(&mut self, qps: &[QpInfo]) -> Result<(), PerfError> {
        for q in qps {
            self.send_line(&q.to_line())?;
        }
        Ok(())
    }

    /// Server: accepts the test with this path MTU (its QP lines follow).
    pub fn send_accept(&mut self, mtu: u32) -> Result<(), PerfError> {
        self.send_line(&format!("accept mtu={mtu}"))
    }

    /// Client: waits for the server's accept line (or its error) and returns the MTU.
    pub fn recv_accept(&mut self) -> Result<u32, PerfError> {
        let l = self.expect_line("answer from the server")?;
        if let Some(Ctl::Error(m)) = Ctl::parse(&l) {
            return Err(PerfError::Peer(m));
        }
        l.strip_prefix("accept mtu=")
            .and_then(|m| m.trim().parse().ok())
            .ok_or_else(|| self.err(format!("unexpected answer '{l}'")))
    }

    /// Sends a control message.
    pub fn send(&mut self, m: &Ctl) -> Result<(), PerfError> {
        self.send_line(&m.to_line())
    }

    /// Receives a control message, waiting up to `timeout`; an `error` line from the
    /// peer becomes [`PerfError::Peer`].
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Ctl>, PerfError> {
        match self.read_line(timeout)? {
            None => Ok(None),
            Some(l) => match Ctl::parse(&l) {
                Some(Ctl::Error(m)) => Err(PerfError::Peer(m)),
                Some(c) => Ok(Some(c)),
                None => Err(self.err(format!("unexpected message '{l}'"))),
            },
        }
    }

    /// Waits for a message until `deadline`.
    pub fn recv_until(&mut self, deadline: Instant) -> Result<Option<Ctl>, PerfError> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.recv(Some(left.max(Duration::from_millis(1))))
    }
}

/// Whether `s` has bytes to read (or is closed) within `timeout`, to the nanosecond
/// (`ppoll`, whose timeout is a high-resolution timer).
fn readable(s: &TcpStream, timeout: Duration) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    loop {
        // SAFETY: `pfd` and `ts` are valid for the call, one descriptor, no signal mask.
        let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let q = QpInfo {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from_ip("127.0.0.2".parse().unwrap()),
            rkey: 0x1234_5678,
            va: 0x7f00_0000_1000,
            len: 65536,
        };
        assert_eq!(QpInfo::parse(&q.to_line()), Some(q));
        let p = TestParams {
            op: "write".into(),
            lat: true,
            size: 4096,
            iters: 1000,
            duration_ms: 0,
            qps: 2,
            tx_depth: 128,
            mtu: 4096,
            verify: true,
            slots: 128,
            shared: true,
            events: false,
        };
        assert_eq!(TestParams::parse(&p.to_line()), Ok(p));
        for c in [
            Ctl::Credit { qp: 1, count: 99 },
            Ctl::End(vec![5, 6]),
            Ctl::Verdict(true, "all good".into()),
            Ctl::Error("boom".into()),
        ] {
            assert_eq!(Ctl::parse(&c.to_line()), Some(c));
        }
        assert!(TestParams::parse("GET / HTTP/1.1").is_err());
    }
}
