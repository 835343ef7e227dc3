//! The GVSP mode: a camera sending GigE Vision stream packets over UDP with a
//! retention buffer, and a receiver that tracks holes and asks for resends with GVCP
//! PACKETRESEND commands on a small control socket.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::frame::{self, FrameSpec};
use crate::gvsp::{self, Content, Header, ImageLeader, ResendRequest, HEADER_LEN};
use crate::rdma::FrameSent;
use crate::ring::{FrameInfo, FrameStatus, Overflow, ReadyQueue, RxCounters};
use crate::stats::{now_ns, Rng};
use crate::StreamError;

/// Bytes of IPv4 + UDP headers (GVSP packet size counts from the IP header).
const IP_UDP: usize = 28;

fn set_buf(sock: &UdpSocket, opt: libc::c_int, force: libc::c_int, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for o in [force, opt] {
        // SAFETY: a valid socket fd and a pointer to an int of the right size.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                o,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return;
        }
    }
}

/// Image bytes per payload packet for a GVSP packet size (IP header to end).
pub fn data_per_packet(packet_size: usize) -> usize {
    packet_size.saturating_sub(IP_UDP + HEADER_LEN).max(64)
}

/// A GVSP camera: stream socket, control socket for resend requests, and a retention
/// buffer of the last frames.
pub struct GvspCamera {
    spec: FrameSpec,
    stream: UdpSocket,
    ctl: UdpSocket,
    dest: SocketAddr,
    dpp: usize,
    retention: VecDeque<(u64, u64, Vec<u8>)>,
    keep: usize,
    pkt: Vec<u8>,
    loss: f64,
    rng: Rng,
    /// Packets sent again on request.
    pub resent: u64,
}

impl GvspCamera {
    /// Binds the stream and control sockets on `ip` and streams to `dest`;
    /// `packet_size` is the GVSP packet size (e.g. 9000 for jumbo frames);
    /// the last `retention` frames can be resent.
    pub fn new(
        ip: IpAddr,
        dest: SocketAddr,
        spec: FrameSpec,
        packet_size: usize,
        retention: usize,
    ) -> Result<GvspCamera, StreamError> {
        let stream =
            UdpSocket::bind((ip, 0)).map_err(StreamError::io("bind camera stream socket"))?;
        let ctl =
            UdpSocket::bind((ip, 0)).map_err(StreamError::io("bind camera control socket"))?;
        ctl.set_nonblocking(true)
            .map_err(StreamError::io("control socket"))?;
        set_buf(&stream, libc::SO_SNDBUF, libc::SO_SNDBUFFORCE, 8 << 20);
        set_buf(&ctl, libc::SO_RCVBUF, libc::SO_RCVBUFFORCE, 4 << 20);
        let dpp = data_per_packet(packet_size);
        Ok(GvspCamera {
            spec,
            stream,
            ctl,
            dest,
            dpp,
            retention: VecDeque::new(),
            keep: retention.max(1),
            pkt: vec![0u8; HEADER_LEN + dpp.max(gvsp::LEADER_LEN)],
            loss: 0.0,
            rng: Rng::new(1),
            resent: 0,
        })
    }

    /// Where to send resend requests.
    pub fn control_addr(&self) -> Result<SocketAddr, StreamError> {
        self.ctl
            .local_addr()
            .map_err(StreamError::io("control socket address"))
    }

    /// Drops each datagram (original or resent) with probability `p`.
    pub fn set_loss(&mut self, p: f64, seed: u64) {
        self.loss = p.clamp(0.0, 1.0);
        self.rng = Rng::new(seed);
    }

    fn npayload(&self) -> u32 {
        self.spec.image_len().div_ceil(self.dpp) as u32
    }

    /// Sends packet `pid` of retained frame at `idx`; true if the loss emulation ate it.
    fn send_packet(&mut self, idx: usize, pid: u32, status: u16) -> Result<bool, StreamError> {
        let n = self.npayload();
        let Some((id, ts, img)) = self.retention.get(idx) else {
            return Ok(false);
        };
        let (content, len) = if pid == 0 {
            gvsp::write_leader(
                &mut self.pkt[HEADER_LEN..],
                &ImageLeader {
                    timestamp: *ts,
                    pixel_format: self.spec.pixel.pfnc(),
                    width: self.spec.width,
                    height: self.spec.height,
                },
            );
            (Content::Leader, gvsp::LEADER_LEN)
        } else if pid <= n {
            let off = (pid as usize - 1) * self.dpp;
            let end = (off + self.dpp).min(img.len());
            let chunk = img.get(off..end).unwrap_or(&[]);
            self.pkt[HEADER_LEN..HEADER_LEN + chunk.len()].copy_from_slice(chunk);
            (Content::Payload, chunk.len())
        } else if pid == n + 1 {
            gvsp::write_trailer(&mut self.pkt[HEADER_LEN..], self.spec.height);
            (Content::Trailer, gvsp::TRAILER_LEN)
        } else {
            return Ok(false);
        };
        gvsp::write_header(
            &mut self.pkt,
            &Header {
                status,
                content,
                block_id: *id,
                packet_id: pid,
                extended: true,
            },
        );
        if self.rng.chance(self.loss) {
            return Ok(true);
        }
        // Loopback UDP fails with ENOBUFS under pressure: the packet is lost like on a
        // wire, and the resend path recovers it.
        match self
            .stream
            .send_to(&self.pkt[..HEADER_LEN + len], self.dest)
        {
            Ok(_) => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(true),
            Err(e) => Err(StreamError::Io {
                what: "send GVSP packet".into(),
                source: e,
            }),
        }
    }

    /// Answers pending resend requests from the retention buffer; returns how many
    /// requests were served.
    pub fn serve_resends(&mut self) -> Result<usize, StreamError> {
        let mut buf = [0u8; 64];
        let mut served = 0;
        loop {
            let n = match self.ctl.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(served),
                Err(e) => {
                    return Err(StreamError::Io {
                        what: "receive resend request".into(),
                        source: e,
                    })
                }
            };
            let Some(r) = gvsp::decode_resend(&buf[..n]) else {
                continue;
            };
            served += 1;
            let Some(idx) = self
                .retention
                .iter()
                .position(|(id, _, _)| *id == r.block_id)
            else {
                continue; // no longer retained: the receiver gives up on its timer
            };
            let last = r.last.min(self.npayload() + 1);
            for pid in r.first..=last {
                self.send_packet(idx, pid, gvsp::STATUS_RESEND)?;
                self.resent += 1;
            }
        }
    }

    /// Generates frame `id` and sends leader, payload and trailer.
    pub fn send_frame(&mut self, id: u64) -> Result<FrameSent, StreamError> {
        let mut img = if self.retention.len() >= self.keep {
            self.retention.pop_front().map(|r| r.2).unwrap_or_default()
        } else {
            Vec::new()
        };
        img.resize(self.spec.image_len(), 0);
        frame::fill(&self.spec, id, &mut img);
        let ts = now_ns();
        self.retention.push_back((id, ts, img));
        let idx = self.retention.len() - 1;
        let mut damaged = false;
        for pid in 0..=self.npayload() + 1 {
            damaged |= self.send_packet(idx, pid, 0)?;
            if pid % 64 == 63 {
                self.serve_resends()?;
            }
        }
        Ok(FrameSent {
            id,
            ready_ns: ts,
            damaged,
        })
    }
}

struct Block {
    id: u64,
    slot: usize,
    got: Vec<u64>,
    missing: u32,
    highest: Option<u32>,
    timestamp: u64,
    last_ns: u64,
    requests: u32,
    leader: Option<ImageLeader>,
    bytes: usize,
}

impl Block {
    fn has(&self, pid: u32) -> bool {
        self.got
            .get(pid as usize / 64)
            .is_some_and(|w| w & (1 << (pid % 64)) != 0)
    }
}

/// How long a block may sit without progress before its holes are requested again.
const RESEND_AFTER_NS: u64 = 3_000_000;
/// Resend rounds before a frame is given up as incomplete.
const MAX_REQUESTS: u32 = 8;

/// The GVSP host receiver: a ring of frame buffers filled packet by packet.
pub struct GvspReceiver {
    spec: FrameSpec,
    sock: UdpSocket,
    camera_ctl: Option<SocketAddr>,
    dpp: usize,
    npkts: u32,
    slots: Vec<Vec<u8>>,
    free: Vec<bool>,
    /// Per slot: the leader and payload bytes of the frame it holds.
    slot_meta: Vec<(Option<ImageLeader>, usize)>,
    blocks: VecDeque<Block>,
    /// The block id after the newest seen; `None` before the first packet (a camera
    /// that was already streaming does not make its earlier frames "lost").
    next_new: Option<u64>,
    packet_size: usize,
    /// Header form expected: extended ids, or GEV 1.x 16-bit block ids unwrapped to 64.
    extended: bool,
    last_block: Option<u64>,
    queue: ReadyQueue,
    counters: RxCounters,
    req_id: u16,
    buf: Vec<u8>,
}

impl GvspReceiver {
    /// Binds the stream socket on `ip` (port chosen by the OS) with `slots` frame
    /// buffers; `packet_size` must match the camera's.
    pub fn new(
        ip: IpAddr,
        spec: FrameSpec,
        packet_size: usize,
        slots: usize,
        overflow: Overflow,
    ) -> Result<GvspReceiver, StreamError> {
        if !(2..=256).contains(&slots) {
            return Err(StreamError::Invalid("ring slots must be 2..=256".into()));
        }
        let sock = UdpSocket::bind((ip, 0)).map_err(StreamError::io("bind GVSP receiver"))?;
        set_buf(&sock, libc::SO_RCVBUF, libc::SO_RCVBUFFORCE, 64 << 20);
        sock.set_read_timeout(Some(Duration::from_millis(1)))
            .map_err(StreamError::io("receiver timeout"))?;
        let dpp = data_per_packet(packet_size);
        let npkts = spec.image_len().div_ceil(dpp) as u32 + 2;
        Ok(GvspReceiver {
            spec,
            sock,
            camera_ctl: None,
            dpp,
            npkts,
            slots: (0..slots).map(|_| vec![0u8; spec.image_len()]).collect(),
            free: vec![true; slots],
            slot_meta: vec![(None, 0); slots],
            blocks: VecDeque::new(),
            next_new: None,
            packet_size,
            extended: true,
            last_block: None,
            queue: ReadyQueue {
                count_gaps: false,
                ..ReadyQueue::new(overflow, 2.min(slots - 1))
            },
            counters: RxCounters::default(),
            req_id: 0,
            buf: vec![0u8; 65536],
        })
    }

    /// Expects GEV 1.x headers (16-bit block ids, 8-byte header) instead of extended
    /// ids, as devices that were not switched to extended ids send (Aravis's fake
    /// camera, most GEV 1.2 cameras).
    pub fn legacy_ids(mut self) -> GvspReceiver {
        self.extended = false;
        self.dpp = self
            .packet_size
            .saturating_sub(IP_UDP + gvsp::LEGACY_HEADER_LEN)
            .max(64);
        self.npkts = self.spec.image_len().div_ceil(self.dpp) as u32 + 2;
        self
    }

    /// Widens a 16-bit block id to the 64-bit id nearest the last one seen (ids wrap
    /// at 65536; a GEV 1.x camera skips 0 on the wrap, Aravis's fake one does not).
    fn unwrap_block(&mut self, id16: u64) -> u64 {
        let ext = match self.last_block {
            None => id16,
            Some(last) => {
                let delta = (id16 as u16).wrapping_sub(last as u16) as i16;
                last.wrapping_add_signed(i64::from(delta))
            }
        };
        if self.last_block.is_none_or(|l| l < ext) {
            self.last_block = Some(ext);
        }
        ext
    }

    /// The address the camera must stream to.
    pub fn local_addr(&self) -> Result<SocketAddr, StreamError> {
        self.sock
            .local_addr()
            .map_err(StreamError::io("receiver address"))
    }

    /// Where resend requests go (the camera's control socket).
    pub fn set_camera_control(&mut self, addr: SocketAddr) {
        self.camera_ctl = Some(addr);
    }

    fn request(&mut self, block_id: u64, first: u32, last: u32) {
        let Some(ctl) = self.camera_ctl else { return };
        self.req_id = self.req_id.wrapping_add(1).max(1);
        let r = ResendRequest {
            req_id: self.req_id,
            channel: 0,
            block_id,
            first,
            last,
        };
        let sent = if self.extended {
            self.sock.send_to(&gvsp::encode_resend(&r), ctl)
        } else {
            self.sock.send_to(&gvsp::encode_legacy_resend(&r), ctl)
        };
        if sent.is_ok() {
            self.counters.resend_requests += 1;
        }
    }

    fn finish(&mut self, idx: usize, status: FrameStatus) {
        let Some(b) = self.blocks.remove(idx) else {
            return;
        };
        // A frame of another geometry than the ring was sized for is not this stream's
        // image, whatever its packets say.
        let status = match b.leader {
            Some(l) if l.width != self.spec.width || l.height != self.spec.height => {
                FrameStatus::Incomplete
            }
            _ => status,
        };
        if let Some(m) = self.slot_meta.get_mut(b.slot) {
            *m = (b.leader, b.bytes);
        }
        self.queue.push(
            FrameInfo {
                id: b.id,
                slot: b.slot,
                timestamp_ns: b.timestamp,
                arrival_ns: now_ns(),
                status,
            },
            &mut self.counters,
        );
    }

    fn take_slot(&mut self) -> Option<usize> {
        if let Some(s) = self.free.iter().position(|f| *f) {
            self.free[s] = false;
            return Some(s);
        }
        // Ring full: the oldest frame the application has not taken yet goes.
        if self.queue.overflow == Overflow::DropOldest {
            let f = self.queue.ready.pop_front()?;
            self.counters.dropped += 1;
            return Some(f.slot);
        }
        None
    }

    fn on_packet(&mut self, len: usize) {
        let buf = std::mem::take(&mut self.buf);
        self.place(&buf[..len]);
        self.buf = buf;
    }

    fn place(&mut self, pkt: &[u8]) {
        let Some((mut h, data)) = gvsp::parse(pkt) else {
            return;
        };
        if h.packet_id >= self.npkts || h.extended != self.extended {
            return;
        }
        if !h.extended {
            h.block_id = self.unwrap_block(h.block_id);
        }
        if h.status == gvsp::STATUS_RESEND {
            self.counters.resent_packets += 1;
        }
        let idx = match self.blocks.iter().position(|b| b.id == h.block_id) {
            Some(i) => i,
            None if self.next_new.is_none_or(|n| n <= h.block_id) => {
                // Blocks skipped entirely (no packet at all) are lost frames.
                if let Some(n) = self.next_new {
                    self.counters.lost += h.block_id - n;
                }
                self.next_new = Some(h.block_id + 1);
                let Some(slot) = self.take_slot() else {
                    self.counters.dropped += 1;
                    return;
                };
                self.blocks.push_back(Block {
                    id: h.block_id,
                    slot,
                    got: vec![0; (self.npkts as usize).div_ceil(64)],
                    missing: self.npkts,
                    highest: None,
                    timestamp: 0,
                    last_ns: now_ns(),
                    requests: 0,
                    leader: None,
                    bytes: 0,
                });
                self.blocks.len() - 1
            }
            None => return, // a late duplicate of a finished frame
        };
        let pid = h.packet_id;
        let dpp = self.dpp;
        let (gap, id) = {
            let b = &mut self.blocks[idx];
            if b.has(pid) {
                return;
            }
            b.got[pid as usize / 64] |= 1 << (pid % 64);
            b.missing -= 1;
            b.last_ns = now_ns();
            match h.content {
                Content::Leader => {
                    if let Some(l) = gvsp::parse_leader(data) {
                        b.timestamp = l.timestamp;
                        b.leader = Some(l);
                    }
                }
                Content::Payload => {
                    let off = (pid as usize).saturating_sub(1) * dpp;
                    if let Some(dst) = self.slots[b.slot].get_mut(off..) {
                        let n = dst.len().min(data.len());
                        dst[..n].copy_from_slice(&data[..n]);
                        b.bytes += n;
                    }
                }
                Content::Trailer => {}
            }
            // A jump in packet ids of an original transmission: ask for the hole now
            // (as Aravis does) rather than waiting for the timer.
            let gap = match b.highest {
                _ if h.status == gvsp::STATUS_RESEND => None,
                Some(hi) if pid > hi + 1 => Some((hi + 1, pid - 1)),
                None if pid > 0 => Some((0, pid - 1)),
                _ => None,
            };
            if b.highest.is_none_or(|hi| hi < pid) {
                b.highest = Some(pid);
            }
            (gap, b.id)
        };
        if let Some((f, l)) = gap {
            self.request(id, f, l);
        }
        if self.blocks[idx].missing == 0 {
            self.finish(idx, FrameStatus::Complete);
        }
    }

    fn timers(&mut self) {
        let now = now_ns();
        let mut i = 0;
        while i < self.blocks.len() {
            let b = &self.blocks[i];
            if now.saturating_sub(b.last_ns) < RESEND_AFTER_NS {
                i += 1;
                continue;
            }
            if b.requests >= MAX_REQUESTS {
                self.finish(i, FrameStatus::Incomplete);
                continue;
            }
            // Every missing range, coalesced.
            let mut ranges = Vec::new();
            let mut start = None;
            for pid in 0..self.npkts {
                match (b.has(pid), start) {
                    (false, None) => start = Some(pid),
                    (true, Some(s)) => {
                        ranges.push((s, pid - 1));
                        start = None;
                    }
                    _ => {}
                }
            }
            if let Some(s) = start {
                ranges.push((s, self.npkts - 1));
            }
            let id = b.id;
            for (f, l) in ranges {
                self.request(id, f, l);
            }
            let b = &mut self.blocks[i];
            b.requests += 1;
            b.last_ns = now;
            i += 1;
        }
    }

    /// The next frame in id order, waiting up to `timeout`; `None` on timeout.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<FrameInfo>, StreamError> {
        let deadline = Instant::now() + timeout;
        loop {
            // Deliver in order: only when no older frame is still being assembled.
            let oldest_open = self.blocks.iter().map(|b| b.id).min();
            if let Some(f) = self.queue.ready.front() {
                if oldest_open.is_none_or(|o| o > f.id) {
                    let f = self.queue.ready.pop_front().ok_or_else(|| {
                        StreamError::Invalid("ready queue emptied under us".into())
                    })?;
                    match f.status {
                        FrameStatus::Complete => self.counters.complete += 1,
                        FrameStatus::Incomplete => self.counters.incomplete += 1,
                    }
                    return Ok(Some(f));
                }
            }
            let mut buf = std::mem::take(&mut self.buf);
            let r = self.sock.recv(&mut buf);
            self.buf = buf;
            match r {
                Ok(n) => self.on_packet(n),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => {
                    return Err(StreamError::Io {
                        what: "receive GVSP packet".into(),
                        source: e,
                    })
                }
            }
            self.timers();
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// The image leader of a delivered frame (width, height, pixel format, camera
    /// timestamp), if its leader arrived.
    pub fn leader(&self, f: &FrameInfo) -> Option<ImageLeader> {
        self.slot_meta.get(f.slot).and_then(|m| m.0)
    }

    /// Image payload bytes placed for a delivered frame.
    pub fn payload_len(&self, f: &FrameInfo) -> usize {
        self.slot_meta.get(f.slot).map_or(0, |m| m.1)
    }

    /// The image bytes of `slot`.
    pub fn image(&self, slot: usize) -> &[u8] {
        self.slots.get(slot).map_or(&[][..], |v| &v[..])
    }

    /// Gives a frame's slot back to the ring.
    pub fn release(&mut self, f: &FrameInfo) {
        if let Some(s) = self.free.get_mut(f.slot) {
            *s = true;
        }
    }

    /// The frame geometry this receiver expects.
    pub fn spec(&self) -> FrameSpec {
        self.spec
    }

    /// Frames still being assembled.
    pub fn in_progress(&self) -> usize {
        self.blocks.len()
    }

    /// Counters so far.
    pub fn counters(&self) -> RxCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PixelFormat;

    /// GEV 1.x frames across the 16-bit block id wrap arrive as four consecutive
    /// complete frames, none counted lost, the first one seen not making earlier ids lost.
    #[test]
    fn legacy_ids_unwrap_across_65536() {
        let spec = FrameSpec {
            width: 100,
            height: 30,
            pixel: PixelFormat::Mono8,
        };
        let packet_size = 1036; // 1000 data bytes per packet with the 8-byte header
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let mut rx = GvspReceiver::new(ip, spec, packet_size, 8, Overflow::Block)
            .unwrap()
            .legacy_ids();
        let to = rx.local_addr().unwrap();
        let tx = UdpSocket::bind((ip, 0)).unwrap();
        let mut pkt = vec![0u8; 2000];
        for id16 in [65534u64, 65535, 0, 1] {
            let npayload = spec.image_len().div_ceil(1000) as u32;
            for pid in 0..=npayload + 1 {
                let content = match pid {
                    0 => Content::Leader,
                    p if p == npayload + 1 => Content::Trailer,
                    _ => Content::Payload,
                };
                let h = Header {
                    status: 0,
                    content,
                    block_id: id16,
                    packet_id: pid,
                    extended: false,
                };
                gvsp::write_header(&mut pkt, &h);
                let d = &mut pkt[gvsp::LEGACY_HEADER_LEN..];
                let n = match content {
                    Content::Leader => {
                        let l = ImageLeader {
                            timestamp: 7,
                            pixel_format: spec.pixel.pfnc(),
                            width: spec.width,
                            height: spec.height,
                        };
                        gvsp::write_leader(d, &l);
                        gvsp::LEADER_LEN
                    }
                    Content::Trailer => {
                        gvsp::write_trailer(d, spec.height);
                        gvsp::TRAILER_LEN
                    }
                    Content::Payload => {
                        let off = (pid as usize - 1) * 1000;
                        let n = (spec.image_len() - off).min(1000);
                        d[..n].fill(id16 as u8);
                        n
                    }
                };
                tx.send_to(&pkt[..gvsp::LEGACY_HEADER_LEN + n], to).unwrap();
            }
        }
        let mut ids = Vec::new();
        while let Some(f) = rx.next(Duration::from_millis(200)).unwrap() {
            assert_eq!(f.status, FrameStatus::Complete);
            assert_eq!(rx.payload_len(&f), spec.image_len());
            assert_eq!(rx.leader(&f).map(|l| l.width), Some(100));
            assert!(rx.image(f.slot).iter().all(|&b| b == f.id as u8));
            ids.push(f.id);
            rx.release(&f);
        }
        assert_eq!(ids, [65534, 65535, 65536, 65537]);
        assert_eq!(rx.counters().lost, 0);
    }
}
