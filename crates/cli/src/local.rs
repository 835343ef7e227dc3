//! The two ends of a local measurement (`softhca bench`, `softhca perf --loopback`) as
//! separate processes on loopback: free addresses and ports for them, and child processes
//! to spawn, wait for readiness, collect output from, and reap with `wait4(2)` to learn
//! the CPU time each one used.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::error::CliError;

/// Which pipe a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipe {
    /// Standard output.
    Out,
    /// Standard error.
    Err,
}

/// A running child.
pub struct Proc {
    name: String,
    pid: libc::pid_t,
    lines: Receiver<(Pipe, String)>,
    out: Vec<String>,
    err: Vec<String>,
    reaped: bool,
}

/// A child that exited.
pub struct Finished {
    /// Its stdout lines.
    pub out: Vec<String>,
    /// Its stderr lines.
    pub err: Vec<String>,
    /// User + system CPU seconds (`wait4`'s rusage: the child's own RUSAGE_SELF at exit).
    pub cpu: f64,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr read line by line on two threads.
    pub fn spawn(name: impl Into<String>, mut cmd: Command) -> Result<Proc, CliError> {
        let name = name.into();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| CliError::Usage(format!("cannot start {name}: {e}")))?;
        let pid = child.id() as libc::pid_t;
        let (tx, rx) = mpsc::channel();
        if let Some(o) = child.stdout.take() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(o).lines().map_while(Result::ok) {
                    if tx.send((Pipe::Out, line)).is_err() {
                        break;
                    }
                }
            });
        }
        if let Some(e) = child.stderr.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(e).lines().map_while(Result::ok) {
                    if tx.send((Pipe::Err, line)).is_err() {
                        break;
                    }
                }
            });
        }
        // `child` (the std handle) is dropped without waiting: we reap the pid ourselves
        // with wait4 to get its rusage.
        Ok(Proc {
            name,
            pid,
            lines: rx,
            out: Vec::new(),
            err: Vec::new(),
            reaped: false,
        })
    }

    fn keep(&mut self, pipe: Pipe, line: String) {
        match pipe {
            Pipe::Out => self.out.push(line),
            Pipe::Err => self.err.push(line),
        }
    }

    /// The child's own last words, for error messages.
    fn why(&self) -> String {
        self.err
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string())
            .unwrap_or_else(|| "no message".into())
    }

    /// Waits for a line on `pipe` that contains `marker` and returns it.
    pub fn wait_line(
        &mut self,
        pipe: Pipe,
        marker: &str,
        timeout: Duration,
    ) -> Result<String, CliError> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((p, line)) if p == pipe && line.contains(marker) => return Ok(line),
                Ok((p, line)) => self.keep(p, line),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(CliError::timeout(format!(
                        "{} did not get ready within {} s",
                        self.name,
                        timeout.as_secs()
                    )))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Exited before it got ready: its stderr says why.
                    let why = self.why();
                    return Err(CliError::peer(format!("{} failed: {why}", self.name)));
                }
            }
        }
    }

    /// Waits for the child to exit (killing it at `deadline`), then returns its output and
    /// CPU time. A non-zero exit is an error carrying the child's last stderr line.
    pub fn finish(mut self, deadline: Instant) -> Result<Finished, CliError> {
        let mut status: libc::c_int = 0;
        // SAFETY: rusage is plain old data; all-zero is a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let mut killed = false;
        loop {
            // SAFETY: `status` and `ru` are valid, writable and live for the call; `pid`
            // is our own unreaped child (only this struct reaps it).
            let rc = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut ru) };
            if rc == self.pid {
                self.reaped = true;
                break;
            }
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                self.reaped = true;
                return Err(CliError::Usage(format!("wait for {}: {e}", self.name)));
            }
            if !killed && Instant::now() >= deadline {
                // SAFETY: kill has no memory effects; the pid is still our unreaped child.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                killed = true;
            }
            // Collect output meanwhile so the child never blocks on a full pipe.
            match self.lines.recv_timeout(Duration::from_millis(10)) {
                Ok((p, l)) => self.keep(p, l),
                Err(RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(5)),
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        // The pipes close at exit: drain what is left (bounded, in case a grandchild holds
        // them open).
        let drain_end = Instant::now() + Duration::from_secs(2);
        loop {
            let left = drain_end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((p, l)) => self.keep(p, l),
                Err(_) => break,
            }
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        let cpu = tv(ru.ru_utime) + tv(ru.ru_stime);
        if killed {
            return Err(CliError::timeout(format!("{} did not finish", self.name)));
        }
        let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        if !ok {
            let why = self.why();
            return Err(CliError::peer(format!("{} failed: {why}", self.name)));
        }
        Ok(Finished {
            out: std::mem::take(&mut self.out),
            err: std::mem::take(&mut self.err),
            cpu,
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // An error path left the child running: stop and reap it so no zombie or stray
        // server stays behind.
        // SAFETY: the pid is our unreaped child; kill and a blocking wait4 on it touch no
        // memory of ours beyond `status`.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            let mut status: libc::c_int = 0;
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}

/// The last stdout line that parses as a JSON object.
pub fn last_json(f: &Finished, name: &str) -> Result<serde_json::Value, CliError> {
    f.out
        .iter()
        .rev()
        .filter(|l| l.trim_start().starts_with('{'))
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| CliError::peer(format!("{name} printed no result")))
}

/// Loopback addresses whose RoCE UDP port is free at the moment of asking, for the
/// devices of the two ends (127.0.0.160-254, clear of the usual .1/.2). The scan starts
/// at an offset from the process id so that runs started together (a test suite) do
/// not pick the same pair between probing and opening; another process may still take
/// one first, so whoever opens a device on it must be ready to move on to the next.
pub fn free_device_ips() -> impl Iterator<Item = IpAddr> {
    const FIRST: u32 = 160;
    const COUNT: u32 = 95;
    let start = std::process::id() % COUNT;
    (0..COUNT)
        .map(move |i| FIRST + (start + i) % COUNT)
        .map(|octet| IpAddr::V4(Ipv4Addr::new(127, 0, 0, octet as u8)))
        .filter(|&ip| UdpSocket::bind(SocketAddr::new(ip, softhca_io::ROCE_UDP_PORT)).is_ok())
}

/// Two of [`free_device_ips`].
pub fn free_device_pair() -> Result<(IpAddr, IpAddr), CliError> {
    let mut ips = free_device_ips();
    match (ips.next(), ips.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(CliError::Usage(
            "no two free loopback addresses (UDP port 4791 in use on 127.0.0.160-254)".into(),
        )),
    }
}

/// A TCP port nobody listens on right now (the kernel's choice for port 0).
pub fn free_tcp_port() -> Result<u16, CliError> {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let l = TcpListener::bind(addr).map_err(CliError::listen(addr))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(CliError::listen(addr))
}
