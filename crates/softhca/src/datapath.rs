//! The datapath thread: sockets ↔ engine, one batch at a time.
//!
//! Each iteration: receive a batch from every socket (no lock held) → lock the engine
//! once → feed every datagram (GRO datagrams split into their segments) → run expired
//! timers → move completions and events out → fill the transmit buffers → unlock →
//! send the batch. Nothing is allocated, locked or system-called per packet.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use softhca_io::{self as sio, Events, Poller, RecvBatch};
use softhca_transport::{DatagramInfo, Transmit};

use crate::config::PollMode;
use crate::context::{Shared, Stats};
use crate::error::Error;
use crate::Nanos;

/// Datagrams per `recvmmsg` per socket.
const RECV_BATCH: usize = 32;
/// Transmit buffers filled per lock hold.
const TX_BATCH: usize = 16;
/// Bytes per transmit buffer: one full GSO super-datagram (64 KiB less IP/UDP headers).
const TX_BUF: usize = 65_507;
/// Token of the doorbell in the poller (sockets use their index).
const DOORBELL: u64 = u64::MAX;
/// How long a full socket buffer may hold up a batch before its packets are dropped
/// (RoCE recovers them by retransmission).
const SEND_STALL_LIMIT: Duration = Duration::from_millis(200);

/// The datapath's preallocated state; lives on the datapath thread.
pub(crate) struct Datapath {
    shared: Arc<Shared>,
    poller: Poller,
    events: Events,
    rx: Vec<RecvBatch>,
    rx_count: Vec<usize>,
    local_ips: Vec<IpAddr>,
    tx_bufs: Vec<Box<[u8]>>,
    tx: Vec<(usize, Transmit)>,
}

impl Datapath {
    pub(crate) fn new(shared: Arc<Shared>) -> Result<Datapath, Error> {
        let poller = Poller::new()?;
        for (i, s) in shared.sockets.iter().enumerate() {
            poller.add(s.as_raw_fd(), i as u64)?;
        }
        poller.add(shared.doorbell.as_raw_fd(), DOORBELL)?;
        let rx = shared
            .sockets
            .iter()
            .map(|s| RecvBatch::for_socket(s, RECV_BATCH))
            .collect();
        let local_ips = shared.sockets.iter().map(|s| s.local_addr().ip()).collect();
        Ok(Datapath {
            poller,
            events: Events::with_capacity(shared.sockets.len() + 1),
            rx,
            rx_count: vec![0; shared.sockets.len()],
            local_ips,
            tx_bufs: (0..TX_BATCH)
                .map(|_| vec![0u8; TX_BUF].into_boxed_slice())
                .collect(),
            tx: Vec::with_capacity(TX_BATCH),
            shared,
        })
    }

    pub(crate) fn run(mut self, cpu: Option<usize>) {
        if let Some(cpu) = cpu {
            if let Err(e) = sio::pin_current_thread(cpu) {
                tracing::warn!("cannot pin the datapath thread to CPU {cpu}: {e}");
            }
        }
        let mut deadline: Option<Nanos> = None;
        let mut more_tx = false;
        let mut last_active = Instant::now();
        let mut iterations = 0u64;
        while !self.shared.stop.load(Ordering::Relaxed) {
            iterations += 1;
            let rx = self.receive();
            let now = self.shared.now();
            let pending = self.shared.pending.swap(false, Ordering::SeqCst);
            let due = deadline.is_some_and(|d| d <= now);
            let mut active = rx > 0;
            if rx > 0 || pending || due || more_tx {
                let ntx;
                (ntx, deadline) = self.process(now);
                more_tx = ntx == TX_BATCH;
                if ntx > 0 {
                    self.send();
                    active = true;
                }
            }
            if active {
                last_active = Instant::now();
                continue;
            }
            let sleep = match self.shared.poll {
                PollMode::Busy => false,
                PollMode::Adaptive { spin_us } => {
                    last_active.elapsed() >= Duration::from_micros(u64::from(spin_us))
                }
                PollMode::Blocking => true,
            };
            if sleep {
                Stats::add(
                    &self.shared.stats.loop_iterations,
                    std::mem::take(&mut iterations),
                );
                self.sleep(deadline);
                last_active = Instant::now();
            } else {
                std::hint::spin_loop();
            }
        }
        Stats::add(&self.shared.stats.loop_iterations, iterations);
    }

    /// One `recvmmsg` per socket; returns the number of datagrams received.
    fn receive(&mut self) -> usize {
        let mut total = 0;
        for (i, s) in self.shared.sockets.iter().enumerate() {
            self.rx_count[i] = match s.recv(&mut self.rx[i]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => {
                    // e.g. ICMP port unreachable reported on the socket: nothing to do.
                    tracing::trace!("recv on {}: {e}", s.local_addr());
                    Stats::add(&self.shared.stats.rx_errors, 1);
                    0
                }
            };
            total += self.rx_count[i];
        }
        total
    }

    /// Under one engine lock: feed, time, deliver, fill transmits. Returns the number of
    /// filled transmit buffers and the next deadline.
    fn process(&mut self, now: Nanos) -> (usize, Option<Nanos>) {
        let shared = &*self.shared;
        let mut core = shared.core.lock();
        let (mut datagrams, mut packets, mut gro, mut truncated) = (0u64, 0u64, 0u64, 0u64);
        for (i, batch) in self.rx.iter().enumerate() {
            let n = self.rx_count[i];
            for k in 0..n.min(batch.len()) {
                let (meta, buf) = batch.get(k);
                datagrams += 1;
                if meta.truncated {
                    truncated += 1;
                    continue;
                }
                let dst = meta.dst_ip.unwrap_or(self.local_ips[i]);
                if meta.stride < meta.len {
                    gro += 1;
                }
                for (j, seg) in sio::segments(&meta, buf).enumerate() {
                    let info = DatagramInfo {
                        src: meta.src,
                        dst,
                        segment_index: j as u16,
                    };
                    core.engine.handle_datagram(now, &info, seg);
                    packets += 1;
                }
            }
        }
        if core.engine.poll_timeout().is_some_and(|d| d <= now) {
            core.engine.handle_timeout(now);
        }
        core.deliver(shared);
        self.tx.clear();
        for (b, buf) in self.tx_bufs.iter_mut().enumerate() {
            match core.engine.poll_transmit(now, buf) {
                Some(t) => self.tx.push((b, t)),
                None => break,
            }
        }
        // Building packets completes work too (UD sends, unsignaled-batch bookkeeping).
        core.deliver(shared);
        let deadline = core.engine.poll_timeout();
        drop(core);
        let st = &shared.stats;
        if datagrams > 0 {
            Stats::add(&st.rx_batches, 1);
        }
        Stats::add(&st.rx_datagrams, datagrams);
        Stats::add(&st.rx_packets, packets);
        Stats::add(&st.rx_gro_datagrams, gro);
        Stats::add(&st.rx_truncated, truncated);
        (self.tx.len(), deadline)
    }

    /// Sends the filled transmit buffers, one `sendmmsg` batch per socket.
    fn send(&mut self) {
        let st = &self.shared.stats;
        Stats::add(&st.tx_batches, 1);
        Stats::add(&st.tx_transmits, self.tx.len() as u64);
        for (si, sock) in self.shared.sockets.iter().enumerate() {
            let ip = self.local_ips[si];
            let list: SmallVec<[sio::Transmit<'_>; TX_BATCH]> = self
                .tx
                .iter()
                .filter(|(_, t)| t.src == ip)
                .map(|&(b, t)| sio::Transmit {
                    dst: t.dst,
                    src_ip: None,
                    contents: &self.tx_bufs[b][..t.len.min(TX_BUF)],
                    segment_size: (t.segment_size > 0 && t.segment_size < t.len)
                        .then_some(t.segment_size),
                })
                .collect();
            if !list.is_empty() {
                send_all(&self.shared, sock, &list);
            }
        }
        let unmatched = self
            .tx
            .iter()
            .filter(|(_, t)| !self.local_ips.contains(&t.src))
            .count();
        if unmatched > 0 {
            tracing::debug!("{unmatched} transmits from an address this device does not serve");
            Stats::add(&st.tx_no_socket, unmatched as u64);
        }
    }

    /// Sleeps in epoll until a packet, a doorbell or the next deadline.
    fn sleep(&mut self, deadline: Option<Nanos>) {
        let shared = &*self.shared;
        shared.sleeping.store(true, Ordering::SeqCst);
        // Dekker with `Shared::kick`: a post after our last `pending.swap` either sees
        // `sleeping` and rings, or we see `pending` here.
        if shared.pending.load(Ordering::SeqCst) || shared.stop.load(Ordering::SeqCst) {
            shared.sleeping.store(false, Ordering::SeqCst);
            return;
        }
        let timeout = deadline.map(|d| Duration::from_nanos(d.saturating_sub(shared.now())));
        Stats::add(&shared.stats.sleeps, 1);
        if let Err(e) = self.poller.wait(&mut self.events, timeout) {
            tracing::warn!("epoll_wait: {e}");
            std::thread::sleep(Duration::from_millis(1));
        }
        shared.sleeping.store(false, Ordering::SeqCst);
        if self.events.iter().any(|e| e.token == DOORBELL) {
            shared.doorbell.drain();
        }
    }
}

/// Sends every transmit of `list` on `sock`, waiting for buffer space when the socket is
/// full, dropping one that the kernel refuses (for RoCE that is a lost packet).
fn send_all(shared: &Shared, sock: &sio::RoceSocket, list: &[sio::Transmit<'_>]) {
    let mut off = 0;
    let mut stalled: Option<Instant> = None;
    while off < list.len() {
        match sock.send(&list[off..]) {
            Ok(0) => off += wait_writable(shared, sock, &mut stalled, list.len() - off),
            Ok(n) => {
                off += n;
                stalled = None;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                off += wait_writable(shared, sock, &mut stalled, list.len() - off);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::debug!("send to {} failed: {e}; dropped", list[off].dst);
                Stats::add(&shared.stats.tx_errors, 1);
                off += 1;
            }
        }
    }
}

/// Waits for the socket to drain; returns how many transmits to skip (all of them once
/// the stall has lasted too long, or the device is closing).
fn wait_writable(
    shared: &Shared,
    sock: &sio::RoceSocket,
    stalled: &mut Option<Instant>,
    left: usize,
) -> usize {
    Stats::add(&shared.stats.tx_would_block, 1);
    let since = *stalled.get_or_insert_with(Instant::now);
    if since.elapsed() > SEND_STALL_LIMIT || shared.stop.load(Ordering::Relaxed) {
        Stats::add(&shared.stats.tx_errors, left as u64);
        return left;
    }
    let _ = crate::sys::poll_fd(
        sock.as_raw_fd(),
        libc::POLLOUT,
        Some(Duration::from_millis(1)),
    );
    0
}
