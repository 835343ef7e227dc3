//! Raw UDP throughput ("blast"): how fast the kernel moves datagrams between two sockets
//! with GSO and GRO, with no protocol on top. This is the ceiling for any transport built
//! on [`RoceSocket`], and what `softhca bench` and the `udp_blast` example compare
//! against.
//!
//! With `icrc`, the sender seals every datagram with a RoCEv2 ICRC and the receiver
//! checks it, as every RoCEv2 packet needs and kernel rxe does in software too: the
//! ceiling for RoCEv2 over UDP sockets on this CPU, with no transport on top.
//!
//! The sender and the receiver are separate functions so that they can run in two
//! threads ([`blast_loopback`]) or in two processes (`softhca bench`).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softhca_io::{
    pin_current_thread, segments, BindOptions, Capabilities, Events, IoError, Poller, RecvBatch,
    RoceSocket, Transmit,
};
use softhca_wire::{self as wire, UdpPseudo, ICRC_LEN};

/// Largest UDP payload of one IPv4 GSO message (65535 − IPv4 and UDP headers).
const MAX_GSO_PAYLOAD: usize = 65_507;

/// Transmits handed to one [`RoceSocket::send`] call.
const SEND_BATCH: usize = 8;

/// Bytes a sender keeps unconfirmed by the receiver's credits by default: a quarter of
/// softhca's default socket buffer, so the receiver's queue never overflows.
pub const DEFAULT_WINDOW: usize = 4 << 20;

/// The receiver confirms what it got each time this many more bytes have arrived.
const CREDIT_EVERY: u64 = 256 << 10;

/// Datagram buffers per receive call of the measuring receiver: one. A buffer holds a
/// whole GRO datagram (64 KiB) and stays in the CPU's cache; a ring of many (4 MiB for 64)
/// makes the kernel's copy go to memory beyond the caches, and the row then measures that
/// memory rather than the best the UDP path does.
pub const RECV_BATCH: usize = 1;

/// A credit datagram: this tag, then the receiver's byte count (u64, little endian).
const CREDIT_TAG: [u8; 8] = *b"SHCAcred";

/// A sender waiting this long for a credit takes the unconfirmed bytes as lost (a dropped
/// datagram never reaches the receiver's count) and goes on.
const CREDIT_STALL: Duration = Duration::from_millis(20);

/// What a [`blast_send`] run sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendReport {
    /// Payload bytes the kernel accepted.
    pub bytes: u64,
    /// Datagrams those bytes make (`bytes / segment_size`, rounded up per message).
    pub datagrams: u64,
    /// Time spent sending.
    pub elapsed: Duration,
    /// Offloads the socket used (GSO may have been switched off during the run).
    pub capabilities: Capabilities,
    /// Times the sender gave up waiting for a credit (bytes lost on the way).
    pub credit_stalls: u64,
}

/// The pseudo-header every blast datagram's ICRC covers: the IP and UDP headers of a
/// loopback datagram (their contents do not change the cost, which is per byte).
fn blast_pseudo() -> UdpPseudo {
    let lo = std::net::IpAddr::from([127, 0, 0, 1]);
    UdpPseudo::from_addrs(lo, lo, 0, 4791, 0)
}

/// Seals each `seg`-byte datagram of `payload` with an ICRC in its last 4 bytes.
fn seal_all(p: &UdpPseudo, payload: &mut [u8], seg: usize) {
    for d in payload.chunks_mut(seg) {
        let len = d.len().saturating_sub(ICRC_LEN);
        // Only a datagram shorter than its ICRC fails, and the sender never makes one.
        let _ = wire::seal(p, d, len);
    }
}

/// What a [`blast_recv`] run received.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecvReport {
    /// Payload bytes received.
    pub bytes: u64,
    /// Datagrams received (a GRO buffer counts as the datagrams it holds).
    pub datagrams: u64,
    /// `recvmmsg` calls that returned data.
    pub calls: u64,
    /// From the first to the last datagram received.
    pub elapsed: Duration,
    /// Offloads the socket used.
    pub capabilities: Capabilities,
    /// Datagrams whose ICRC did not match (with [`RecvStop::icrc`]).
    pub icrc_failures: u64,
}

impl RecvReport {
    /// Received payload in Gb/s (0 when nothing or a single batch arrived).
    pub fn gbps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s <= 0.0 {
            return 0.0;
        }
        self.bytes as f64 * 8.0 / s / 1e9
    }
}

/// When [`blast_recv`] stops.
#[derive(Debug, Clone, Copy)]
pub struct RecvStop<'a> {
    /// Stop once nothing arrived for this long after the first datagram.
    pub idle: Duration,
    /// Stop at this instant in any case (also when nothing ever arrived).
    pub deadline: Instant,
    /// Stop when this flag turns true (checked between receive calls).
    pub flag: Option<&'a AtomicBool>,
    /// Spin on `recvmmsg` instead of sleeping in epoll when the socket is empty.
    pub busy: bool,
    /// Datagram buffers per `recvmmsg` call.
    pub batch: usize,
    /// Send credits (the byte count so far) back to the sender, for a windowed sender.
    pub credit: bool,
    /// Check each datagram's ICRC (a sender with `icrc` sealed it).
    pub icrc: bool,
}

/// The sender's side of the credit loop: what the receiver confirmed, and the bytes
/// written off as lost so that a dropped datagram cannot stall the run.
struct Credits {
    window: u64,
    confirmed: u64,
    lost: u64,
    last: Instant,
    stalls: u64,
    batch: RecvBatch,
    poller: Poller,
    events: Events,
}

impl Credits {
    fn new(socket: &RoceSocket, window: usize) -> io::Result<Self> {
        let poller = Poller::new().map_err(io::Error::other)?;
        poller
            .add(socket.as_raw_fd(), 0)
            .map_err(io::Error::other)?;
        Ok(Credits {
            window: window as u64,
            confirmed: 0,
            lost: 0,
            last: Instant::now(),
            stalls: 0,
            batch: RecvBatch::new(8, 64),
            poller,
            events: Events::with_capacity(2),
        })
    }

    /// Waits until `next` more bytes fit in the window after `sent`.
    fn wait_for_room(&mut self, socket: &RoceSocket, sent: u64, next: u64) -> io::Result<()> {
        while sent + next > self.confirmed + self.window {
            if self.take(socket)? {
                continue;
            }
            if self.last.elapsed() >= CREDIT_STALL {
                self.stalls += 1;
                self.lost += sent - self.confirmed;
                self.confirmed = sent;
                self.last = Instant::now();
                continue;
            }
            self.poller
                .wait(&mut self.events, Some(Duration::from_millis(1)))?;
        }
        Ok(())
    }

    /// Reads the credits that arrived; true if one moved the window.
    fn take(&mut self, socket: &RoceSocket) -> io::Result<bool> {
        let mut moved = false;
        loop {
            match socket.recv(&mut self.batch) {
                Ok(_) => {
                    for (m, b) in self.batch.iter() {
                        let Some(count) = credit_count(&b[..m.len]) else {
                            continue;
                        };
                        if count + self.lost > self.confirmed {
                            self.confirmed = count + self.lost;
                            self.last = Instant::now();
                            moved = true;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

fn credit_count(d: &[u8]) -> Option<u64> {
    let (tag, count) = d.split_first_chunk::<8>()?;
    (*tag == CREDIT_TAG).then_some(())?;
    Some(u64::from_le_bytes(*count.first_chunk::<8>()?))
}

fn send_credit(socket: &RoceSocket, to: SocketAddr, count: u64) {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&CREDIT_TAG);
    d[8..].copy_from_slice(&count.to_le_bytes());
    let t = Transmit {
        dst: to,
        src_ip: None,
        tos: 0,
        contents: &d,
        pieces: &[],
        segment_size: None,
    };
    // A lost credit is made up for by the next one (the count is cumulative).
    let _ = socket.send(&[t]);
}

/// Sends `segment_size`-byte datagrams to `dst` as fast as the socket takes them, for
/// `duration`. Each [`Transmit`] is one GSO message (as many segments as fit in 64 KiB);
/// without GSO the socket sends them as separate datagrams. A full socket buffer is waited
/// out by yielding, so the sender never blocks for long.
///
/// With a `window`, at most that many bytes are sent beyond what the receiver's credits
/// confirm (a [`blast_recv`] with `credit` on): a sender on a fast CPU otherwise overruns
/// the receiving socket, whose drops waste the receiver's time, so the figure is a rate
/// the pair sustains rather than one a third of whose bytes never arrive.
///
/// With `icrc`, each datagram is sealed with an ICRC before each send, as a RoCEv2
/// sender computes it for every packet it sends.
///
/// Errors: the first send error other than `WouldBlock` (with the bytes sent so far lost).
pub fn blast_send(
    socket: &RoceSocket,
    dst: SocketAddr,
    segment_size: usize,
    duration: Duration,
    window: Option<usize>,
    icrc: bool,
) -> io::Result<SendReport> {
    let seg = segment_size.clamp(ICRC_LEN + wire::BTH_LEN, MAX_GSO_PAYLOAD);
    let per_msg = socket.segments_per_gso_send(seg).max(1);
    let mut payload = vec![0x5au8; per_msg * seg];
    let pseudo = blast_pseudo();
    let mut credits = window.map(|w| Credits::new(socket, w)).transpose()?;
    let start = Instant::now();
    let end = start + duration;
    let mut bytes = 0u64;
    let mut datagrams = 0u64;
    while Instant::now() < end {
        if let Some(c) = credits.as_mut() {
            c.wait_for_room(socket, bytes, (SEND_BATCH * payload.len()) as u64)?;
        }
        if icrc {
            // One seal per datagram sent: the batch sends the buffer SEND_BATCH times.
            for _ in 0..SEND_BATCH {
                seal_all(&pseudo, &mut payload, seg);
            }
        }
        let t = Transmit {
            dst,
            src_ip: None,
            tos: 0,
            contents: &payload,
            pieces: &[],
            segment_size: Some(seg),
        };
        match socket.send(&[t; SEND_BATCH]) {
            Ok(n) => {
                bytes += (n * payload.len()) as u64;
                datagrams += (n * per_msg) as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => return Err(e),
        }
    }
    Ok(SendReport {
        bytes,
        datagrams,
        elapsed: start.elapsed(),
        capabilities: socket.capabilities(),
        credit_stalls: credits.map_or(0, |c| c.stalls),
    })
}

/// Receives and counts datagrams on `socket` until `stop` says so.
pub fn blast_recv(socket: &RoceSocket, stop: RecvStop<'_>) -> Result<RecvReport, IoError> {
    let poller = Poller::new()?;
    poller.add(socket.as_raw_fd(), 0)?;
    let mut events = Events::with_capacity(2);
    let mut batch = RecvBatch::for_socket(socket, stop.batch.max(1));
    let (mut bytes, mut datagrams, mut calls) = (0u64, 0u64, 0u64);
    let (pseudo, mut icrc_failures) = (blast_pseudo(), 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut credited = 0u64;
    loop {
        if stop.flag.is_some_and(|f| f.load(Ordering::Relaxed)) {
            break;
        }
        let now = Instant::now();
        if now >= stop.deadline || (first.is_some() && now.duration_since(last) >= stop.idle) {
            break;
        }
        match socket.recv(&mut batch) {
            Ok(_) => {
                calls += 1;
                last = Instant::now();
                first.get_or_insert(last);
                let mut from = None;
                for (m, b) in batch.iter() {
                    for d in segments(&m, b) {
                        datagrams += 1;
                        if stop.icrc && credit_count(d).is_none() && !wire::verify(&pseudo, d) {
                            icrc_failures += 1;
                        }
                    }
                    bytes += m.len as u64;
                    from = Some(m.src);
                }
                if let Some(to) = from.filter(|_| stop.credit && bytes - credited >= CREDIT_EVERY) {
                    send_credit(socket, to, bytes);
                    credited = bytes;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !stop.busy {
                    // Short waits so the idle and deadline checks stay timely.
                    poller
                        .wait(&mut events, Some(Duration::from_millis(5)))
                        .map_err(|source| IoError::Os {
                            what: "epoll_wait",
                            source,
                        })?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(IoError::Os {
                    what: "recvmmsg",
                    source,
                })
            }
        }
    }
    Ok(RecvReport {
        bytes,
        datagrams,
        calls,
        elapsed: first.map_or(Duration::ZERO, |f| last.duration_since(f)),
        capabilities: socket.capabilities(),
        icrc_failures,
    })
}

/// Settings of a [`blast_loopback`] run.
#[derive(Debug, Clone, Copy)]
pub struct LoopbackBlast {
    /// Offloads the sending socket may use.
    pub tx: BindOptions,
    /// Offloads the receiving socket may use.
    pub rx: BindOptions,
    /// How long to send.
    pub duration: Duration,
    /// Datagram payload size.
    pub segment_size: usize,
    /// Pin the sender to CPU 0 and the receiver to CPU 1.
    pub pin: bool,
    /// Receiver spins instead of sleeping in epoll.
    pub busy: bool,
    /// Receive batch size.
    pub rx_batch: usize,
    /// Credit window of the sender (see [`blast_send`]); `None` sends unpaced.
    pub window: Option<usize>,
    /// Seal and check an ICRC on every datagram.
    pub icrc: bool,
}

/// Sender and receiver in two threads of this process, on 127.0.0.2 → 127.0.0.1
/// (both bound to port 0).
pub fn blast_loopback(cfg: &LoopbackBlast) -> Result<(SendReport, RecvReport), IoError> {
    let rx = RoceSocket::bind_with(SocketAddr::from(([127, 0, 0, 1], 0)), cfg.rx)?;
    let tx = RoceSocket::bind_with(SocketAddr::from(([127, 0, 0, 2], 0)), cfg.tx)?;
    let dst = rx.local_addr();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            if cfg.pin {
                let _ = pin_current_thread(1);
            }
            blast_recv(
                &rx,
                RecvStop {
                    idle: Duration::MAX,
                    deadline: Instant::now() + cfg.duration + Duration::from_secs(10),
                    flag: Some(&stop),
                    busy: cfg.busy,
                    batch: cfg.rx_batch,
                    credit: cfg.window.is_some(),
                    icrc: cfg.icrc,
                },
            )
        });
        if cfg.pin {
            let _ = pin_current_thread(0);
        }
        let sent = blast_send(
            &tx,
            dst,
            cfg.segment_size,
            cfg.duration,
            cfg.window,
            cfg.icrc,
        );
        // Let the receiver drain what is still queued.
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Relaxed);
        let received = receiver.join().unwrap_or_else(|_| {
            Err(IoError::Os {
                what: "receiver thread",
                source: io::Error::other("panicked"),
            })
        })?;
        let sent = sent.map_err(|source| IoError::Os {
            what: "sendmmsg",
            source,
        })?;
        Ok((sent, received))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sealed datagram passes the receiver's check; one changed byte fails it.
    #[test]
    fn sealed_datagrams_verify_and_a_flipped_byte_does_not() {
        let p = blast_pseudo();
        let mut buf = vec![0x5au8; 3 * 1024];
        seal_all(&p, &mut buf, 1024);
        assert!(buf.chunks(1024).all(|d| wire::verify(&p, d)));
        buf[1500] ^= 1;
        let ok: Vec<bool> = buf.chunks(1024).map(|d| wire::verify(&p, d)).collect();
        assert_eq!(ok, [true, false, true]);
    }

    /// Two threads on loopback with ICRCs: bytes arrive, every ICRC checks.
    #[test]
    fn loopback_blast_with_icrc_has_no_failures() {
        let cfg = LoopbackBlast {
            tx: BindOptions::default(),
            rx: BindOptions::default(),
            duration: Duration::from_millis(200),
            segment_size: 4096,
            pin: false,
            busy: false,
            rx_batch: RECV_BATCH,
            window: Some(DEFAULT_WINDOW),
            icrc: true,
        };
        let (sent, got) = blast_loopback(&cfg).expect("blast");
        assert!(sent.bytes > 0 && got.bytes > 0, "{sent:?} {got:?}");
        assert_eq!(got.icrc_failures, 0);
    }
}
