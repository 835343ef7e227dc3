//! The kernel's MPTCP (`IPPROTO_MPTCP`) as the baseline of the multipath table: a bulk
//! sender, a receiver that checks every byte and logs its progress, and a 4 KiB
//! ping-pong for latency beside the bulk flow. iperf3 3.12 (Debian's) has no MPTCP and
//! reports at most every 0.1 s; pauses after a cut need finer times than that.

use std::io::{self, Read, Write};

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

/// What the receiver got.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Received {
    /// Bytes received.
    pub bytes: u64,
    /// Seconds from the connection to the end of the stream.
    pub seconds: f64,
    /// Every byte matched the sender's pattern.
    pub verified: bool,
}

fn socket(addr: &SocketAddr) -> io::Result<Socket> {
    Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::MPTCP),
    )
}

/// An MPTCP listener on `addr`.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = socket(&addr)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(4)?;
    Ok(s.into())
}

/// An MPTCP connection to `addr`.
pub fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = socket(&addr)?;
    s.connect_timeout(&addr.into(), Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    Ok(s.into())
}

/// The stream's content: the 8-byte little-endian word at offset `8k` is `k`.
fn fill(buf: &mut [u8], offset: u64) {
    for (k, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(offset / 8 + k as u64).to_le_bytes());
    }
}

/// Whether `data`, found at stream offset `offset`, is the pattern.
fn check(data: &[u8], offset: u64) -> bool {
    let byte = |o: u64| (o / 8).to_le_bytes()[(o % 8) as usize];
    let head = ((8 - offset % 8) % 8).min(data.len() as u64) as usize;
    if !(0..head).all(|i| data[i] == byte(offset + i as u64)) {
        return false;
    }
    let body = &data[head..];
    let start = (offset + head as u64) / 8;
    let mut words = body.chunks_exact(8);
    let ok = words
        .by_ref()
        .enumerate()
        .all(|(k, w)| w == (start + k as u64).to_le_bytes());
    let tail = words.remainder();
    let at = offset + (data.len() - tail.len()) as u64;
    ok && tail
        .iter()
        .enumerate()
        .all(|(i, &b)| b == byte(at + i as u64))
}

/// Sends the pattern on `s` for `secs` seconds, then closes; returns the bytes sent.
pub fn send(mut s: TcpStream, secs: f64) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = 0u64;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        fill(&mut buf, off);
        s.write_all(&buf)?;
        off += buf.len() as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    // Wait for the receiver to close: its last byte is then received, not just sent.
    let _ = s.read(&mut buf);
    Ok(off)
}

/// Receives one stream to its end, checking the pattern and logging progress.
pub fn receive<W: Write>(
    mut s: TcpStream,
    log: &mut softhca_perf::ProgressLog<W>,
) -> io::Result<Received> {
    let start = Instant::now();
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    let mut verified = true;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        verified &= check(&buf[..n], bytes);
        bytes += n as u64;
        log.update(Instant::now(), bytes);
    }
    log.finish();
    let seconds = start.elapsed().as_secs_f64();
    let _ = s.shutdown(std::net::Shutdown::Both);
    Ok(Received {
        bytes,
        seconds,
        verified,
    })
}

/// Echoes `size`-byte messages on `s` until the peer closes.
pub fn echo(mut s: TcpStream, size: usize) -> io::Result<()> {
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; size];
    loop {
        match s.read_exact(&mut buf) {
            Ok(()) => s.write_all(&buf)?,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Round trips of `size`-byte messages for `secs` seconds (queue depth 1), in
/// nanoseconds.
pub fn ping(mut s: TcpStream, size: usize, secs: f64) -> io::Result<Vec<u64>> {
    let mut buf = vec![0u8; size];
    let mut rtts = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        let t = Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        rtts.push(t.elapsed().as_nanos() as u64);
    }
    Ok(rtts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_checks_at_any_offset() {
        let mut buf = vec![0u8; 64];
        fill(&mut buf, 800);
        for a in 0..16 {
            for b in a..64 {
                assert!(check(&buf[a..b], 800 + a as u64), "{a}..{b}");
            }
        }
        buf[21] ^= 1;
        assert!(!check(&buf[3..40], 803));
        assert!(check(&buf[22..40], 822));
    }
}
