//! The two RDMA modes over softhca: `rc-send` and `uc-write`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::{
    smallvec, AccessFlags, Completion, Context, Cq, Mr, Mtu, Pd, Qp, QpInit, QpType, RecvWr,
    RemoteQp, SendFlags, SendWr, WcOpcode, WcStatus, WrOpcode,
};

use crate::frame::{self, FrameSpec, Trailer, TRAILER_LEN};
use crate::harness::Mode;
use crate::ring::{FrameInfo, FrameStatus, Overflow, ReadyQueue, RxCounters};
use crate::stats::{now_ns, Rng};
use crate::StreamError;

/// Where the host's ring lives (what the host tells a `uc-write` camera at connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RingInfo {
    /// Address of slot 0.
    pub addr: u64,
    /// Remote key of the ring's MR.
    pub rkey: u32,
    /// Number of slots.
    pub slots: usize,
    /// Bytes per slot (image + trailer).
    pub slot_len: usize,
}

/// `wr_id` of the zero-length receives that catch WRITE-with-immediate.
const IMM_RECV: u64 = u64::MAX;

fn qp_type(mode: Mode) -> Result<QpType, StreamError> {
    match mode {
        Mode::RcSend => Ok(QpType::Rc),
        Mode::UcWrite => Ok(QpType::Uc),
        Mode::Gvsp => Err(StreamError::Invalid(
            "gvsp is not an RDMA mode (use GvspReceiver)".into(),
        )),
    }
}

/// The host side of `rc-send` / `uc-write`: a ring of `slots` registered frame buffers.
///
/// `rc-send`: every free slot is posted as a receive; a frame is one SEND into one slot.
/// `uc-write`: the camera writes frame `id` into slot `id % slots` and then sends a
/// zero-length WRITE-with-immediate (imm = low 32 bits of `id`); the receiver checks the
/// slot's trailer to tell complete from incomplete frames.
pub struct RdmaReceiver {
    mode: Mode,
    spec: FrameSpec,
    nslots: usize,
    slot_len: usize,
    queue: ReadyQueue,
    counters: RxCounters,
    /// Slot is with the transport (posted / writable), not ready or held.
    free: Vec<bool>,
    wc: Vec<Completion>,
    next_id: u64,
    // Drop order: QP before the MR and CQ it names.
    qp: Qp,
    mr: Mr,
    cq: Cq,
    _pd: Pd,
    ctx: Arc<Context>,
}

impl RdmaReceiver {
    /// Creates the ring and a QP of the mode's type (not yet connected).
    pub fn new(
        ctx: &Arc<Context>,
        mode: Mode,
        spec: FrameSpec,
        slots: usize,
        overflow: Overflow,
    ) -> Result<RdmaReceiver, StreamError> {
        let ty = qp_type(mode)?;
        if !(2..=64).contains(&slots) {
            return Err(StreamError::Invalid("ring slots must be 2..=64".into()));
        }
        let slot_len = spec.slot_len();
        let pd = ctx.alloc_pd().map_err(StreamError::verbs("alloc_pd"))?;
        let mr = pd
            .reg_mr(
                slot_len * slots,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .map_err(StreamError::verbs("reg_mr(ring)"))?;
        let cq = ctx
            .create_cq(512, None)
            .map_err(StreamError::verbs("create_cq"))?;
        let mut init = QpInit::new(ty, &cq);
        init.cap.max_recv_wr = 256;
        let qp = pd
            .create_qp(&init)
            .map_err(StreamError::verbs("create_qp"))?;
        // Two slots stay with the transport so the camera always has somewhere to go.
        let min_free = 2.min(slots - 1);
        Ok(RdmaReceiver {
            mode,
            spec,
            nslots: slots,
            slot_len,
            queue: ReadyQueue::new(overflow, min_free),
            counters: RxCounters::default(),
            free: vec![true; slots],
            wc: vec![Completion::default(); 64],
            next_id: 0,
            qp,
            mr,
            cq,
            _pd: pd,
            ctx: ctx.clone(),
        })
    }

    /// The QP number to give the camera.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// The device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The ring (for a `uc-write` camera).
    pub fn ring(&self) -> RingInfo {
        RingInfo {
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            slots: self.nslots,
            slot_len: self.slot_len,
        }
    }

    /// Connects to the camera's QP and posts the receives.
    pub fn connect(
        &mut self,
        local_psn: u32,
        remote: &RemoteQp,
        mtu: Mtu,
        gid_index: u8,
    ) -> Result<(), StreamError> {
        self.qp
            .connect_rc(local_psn, remote, mtu, gid_index)
            .map_err(StreamError::verbs("connect receiver QP"))?;
        match self.mode {
            Mode::RcSend => {
                for s in 0..self.nslots {
                    self.post_slot(s)?;
                }
            }
            _ => {
                for _ in 0..128 {
                    self.post_imm_recv()?;
                }
            }
        }
        Ok(())
    }

    fn post_slot(&mut self, s: usize) -> Result<(), StreamError> {
        self.free[s] = true;
        if self.mode == Mode::RcSend {
            let sge = self.mr.sge(s * self.slot_len, self.slot_len as u32);
            self.qp
                .post_recv(RecvWr {
                    wr_id: s as u64,
                    sg_list: smallvec![sge],
                })
                .map_err(StreamError::verbs("post_recv"))?;
        }
        Ok(())
    }

    fn post_imm_recv(&self) -> Result<(), StreamError> {
        self.qp
            .post_recv(RecvWr {
                wr_id: IMM_RECV,
                sg_list: smallvec![],
            })
            .map_err(StreamError::verbs("post_recv"))
    }

    fn trailer_ok(&self, slot: usize, id: Option<u64>) -> Option<Trailer> {
        let mut t = [0u8; TRAILER_LEN];
        self.mr
            .read(slot * self.slot_len + self.spec.image_len(), &mut t)
            .ok()?;
        let tr = Trailer::read(&t)?;
        if tr.image_len as usize != self.spec.image_len() || id.is_some_and(|i| i != tr.frame_id) {
            return None;
        }
        Some(tr)
    }

    fn on_completion(&mut self, c: Completion) -> Result<(), StreamError> {
        if c.status != WcStatus::Success {
            return Err(StreamError::Completion {
                op: "receive",
                status: c.status,
            });
        }
        let now = now_ns();
        match self.mode {
            Mode::RcSend => {
                let slot = c.wr_id as usize;
                if slot >= self.nslots {
                    return Ok(());
                }
                self.free[slot] = false;
                let tr = if c.byte_len as usize == self.slot_len {
                    self.trailer_ok(slot, None)
                } else {
                    None
                };
                let (id, ts, status) = match tr {
                    Some(t) => (t.frame_id, t.timestamp_ns, FrameStatus::Complete),
                    None => (self.next_id, 0, FrameStatus::Incomplete),
                };
                self.next_id = id + 1;
                self.queue.push(
                    FrameInfo {
                        id,
                        slot,
                        timestamp_ns: ts,
                        arrival_ns: now,
                        status,
                    },
                    &mut self.counters,
                );
            }
            _ => {
                if c.opcode != WcOpcode::RecvRdmaWithImm {
                    return Ok(());
                }
                self.post_imm_recv()?;
                // The imm carries the low 32 bits; the nearest id at or after the
                // expected one with those bits is the frame.
                let lo = u64::from(c.imm_data);
                let mut id = (self.next_id & !0xFFFF_FFFF) | lo;
                if id + (1 << 31) < self.next_id {
                    id += 1 << 32;
                }
                let slot = (id % self.nslots as u64) as usize;
                // Frames whose slot the camera is (re)writing now are gone: this id's
                // slot and the next one's.
                let n = self.nslots as u64;
                let mut dropped = Vec::new();
                self.queue.ready.retain(|f| {
                    let keep = f.id + n > id + 1;
                    if !keep {
                        dropped.push(f.slot);
                    }
                    keep
                });
                for s in dropped {
                    self.counters.dropped += 1;
                    self.free[s] = true;
                }
                self.free[slot] = false;
                let (ts, status) = match self.trailer_ok(slot, Some(id)) {
                    Some(t) => (t.timestamp_ns, FrameStatus::Complete),
                    None => (0, FrameStatus::Incomplete),
                };
                self.next_id = self.next_id.max(id + 1);
                self.queue.push(
                    FrameInfo {
                        id,
                        slot,
                        timestamp_ns: ts,
                        arrival_ns: now,
                        status,
                    },
                    &mut self.counters,
                );
            }
        }
        let nfree = self.free.iter().filter(|f| **f).count();
        for s in self.queue.shed(nfree, &mut self.counters) {
            self.post_slot(s)?;
        }
        Ok(())
    }

    /// The next frame in id order, waiting up to `timeout`; `None` on timeout. The
    /// frame's slot stays out of the ring until [`RdmaReceiver::release`].
    pub fn next(&mut self, timeout: Duration) -> Result<Option<FrameInfo>, StreamError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(f) = self.queue.ready.pop_front() {
                match f.status {
                    FrameStatus::Complete => self.counters.complete += 1,
                    FrameStatus::Incomplete => self.counters.incomplete += 1,
                }
                return Ok(Some(f));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let mut wc = std::mem::take(&mut self.wc);
            let n = self
                .cq
                .wait(&mut wc, left)
                .map_err(StreamError::verbs("poll receive CQ"));
            let res = n.and_then(|n| {
                for c in &wc[..n] {
                    self.on_completion(*c)?;
                }
                Ok(n)
            });
            self.wc = wc;
            if res? == 0 && Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// The image bytes of `slot`.
    pub fn image(&self, slot: usize) -> &[u8] {
        let slot = slot.min(self.nslots - 1);
        // SAFETY: in bounds of the MR (slot < nslots, image_len < slot_len), which lives
        // as long as `self`. A slot handed out by `next` is not posted (rc-send) and,
        // with credits or drop-oldest, not being written (uc-write); a racing device
        // write could only mix u8 values, which are all valid.
        unsafe {
            std::slice::from_raw_parts(
                self.mr.as_ptr().add(slot * self.slot_len),
                self.spec.image_len(),
            )
        }
    }

    /// `uc-write`: true if `f`'s slot still holds frame `f.id` (check after use: the
    /// camera does not wait for the host unless credits are used).
    pub fn still_valid(&self, f: &FrameInfo) -> bool {
        self.mode != Mode::UcWrite || self.trailer_ok(f.slot, Some(f.id)).is_some()
    }

    /// Gives a frame's slot back to the ring.
    pub fn release(&mut self, f: &FrameInfo) -> Result<(), StreamError> {
        if f.slot < self.nslots && !self.free[f.slot] {
            self.post_slot(f.slot)?;
        }
        Ok(())
    }

    /// Counters so far.
    pub fn counters(&self) -> RxCounters {
        self.counters
    }
}

/// What the camera knows about one sent frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FrameSent {
    /// Frame id.
    pub id: u64,
    /// When the frame was ready at the camera, before its first byte went to the
    /// transport (ns, CLOCK_MONOTONIC; the timestamp the frame carries). Latency counts
    /// from here in every mode: GVSP sends a frame within the call, RDMA posts it and
    /// returns, so "handed to the transport" would time GVSP's last packet against
    /// RDMA's whole frame.
    pub ready_ns: u64,
    /// Loss emulation damaged it (uc-write, gvsp before resends).
    pub damaged: bool,
}

/// The camera side of `rc-send` / `uc-write`: `nbuf` registered frame buffers.
pub struct RdmaCamera {
    mode: Mode,
    spec: FrameSpec,
    nbuf: usize,
    slot_len: usize,
    busy: Vec<bool>,
    ring: RingInfo,
    mtu: usize,
    loss: f64,
    rng: Rng,
    wc: Vec<Completion>,
    pending: VecDeque<usize>,
    qp: Qp,
    mr: Mr,
    cq: Cq,
    _pd: Pd,
}

impl RdmaCamera {
    /// Creates `nbuf` frame buffers and a QP of the mode's type.
    pub fn new(
        ctx: &Arc<Context>,
        mode: Mode,
        spec: FrameSpec,
        nbuf: usize,
    ) -> Result<RdmaCamera, StreamError> {
        let ty = qp_type(mode)?;
        let nbuf = nbuf.clamp(1, 16);
        let slot_len = spec.slot_len();
        let pd = ctx.alloc_pd().map_err(StreamError::verbs("alloc_pd"))?;
        let mr = pd
            .reg_mr(slot_len * nbuf, AccessFlags::LOCAL_WRITE)
            .map_err(StreamError::verbs("reg_mr(camera)"))?;
        let cq = ctx
            .create_cq(256, None)
            .map_err(StreamError::verbs("create_cq"))?;
        let qp = pd
            .create_qp(&QpInit::new(ty, &cq))
            .map_err(StreamError::verbs("create_qp"))?;
        Ok(RdmaCamera {
            mode,
            spec,
            nbuf,
            slot_len,
            busy: vec![false; nbuf],
            ring: RingInfo::default(),
            mtu: 4096,
            loss: 0.0,
            rng: Rng::new(1),
            wc: vec![Completion::default(); 32],
            pending: VecDeque::new(),
            qp,
            mr,
            cq,
            _pd: pd,
        })
    }

    /// The QP number to give the host.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// Emulated packet loss (uc-write only, see the crate docs): probability per packet.
    pub fn set_loss(&mut self, p: f64, seed: u64) {
        self.loss = p.clamp(0.0, 1.0);
        self.rng = Rng::new(seed);
    }

    /// Connects to the host's QP; `ring` is the host's ring (used by uc-write).
    pub fn connect(
        &mut self,
        local_psn: u32,
        remote: &RemoteQp,
        mtu: Mtu,
        gid_index: u8,
        ring: RingInfo,
    ) -> Result<(), StreamError> {
        if self.mode == Mode::UcWrite && (ring.slots == 0 || ring.slot_len < self.slot_len) {
            return Err(StreamError::Invalid(
                "host ring slots are smaller than a frame".into(),
            ));
        }
        self.ring = ring;
        self.mtu = mtu.bytes();
        self.qp
            .connect_rc(local_psn, remote, mtu, gid_index)
            .map_err(StreamError::verbs("connect camera QP"))
    }

    fn reap(&mut self, timeout: Duration) -> Result<usize, StreamError> {
        let n = self
            .cq
            .wait(&mut self.wc, timeout)
            .map_err(StreamError::verbs("poll send CQ"))?;
        for c in &self.wc[..n] {
            if c.status != WcStatus::Success {
                return Err(StreamError::Completion {
                    op: "send",
                    status: c.status,
                });
            }
            // Send completions come in post order (IBTA 10.8.6 for one QP).
            if let Some(b) = self.pending.pop_front() {
                self.busy[b] = false;
            }
        }
        Ok(n)
    }

    /// Waits until every posted frame has completed.
    pub fn flush(&mut self, timeout: Duration) -> Result<(), StreamError> {
        let deadline = Instant::now() + timeout;
        while !self.pending.is_empty() {
            if Instant::now() >= deadline {
                return Err(StreamError::Timeout("camera sends did not complete".into()));
            }
            self.reap(Duration::from_millis(50))?;
        }
        Ok(())
    }

    /// Generates frame `id` and sends it.
    pub fn send_frame(&mut self, id: u64) -> Result<FrameSent, StreamError> {
        let b = (id % self.nbuf as u64) as usize;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.busy[b] {
            if Instant::now() >= deadline {
                return Err(StreamError::Timeout(format!(
                    "camera buffer of frame {id} never completed"
                )));
            }
            self.reap(Duration::from_millis(100))?;
        }
        let off = b * self.slot_len;
        let img = self.spec.image_len();
        // SAFETY: [off, off + slot_len) is inside the MR (b < nbuf) and not posted
        // (busy[b] is false), so nothing else reads or writes it now.
        let buf =
            unsafe { std::slice::from_raw_parts_mut(self.mr.as_ptr().add(off), self.slot_len) };
        frame::fill(&self.spec, id, &mut buf[..img]);
        let ts = now_ns();
        Trailer {
            frame_id: id,
            timestamp_ns: ts,
            image_len: img as u32,
        }
        .write(&mut buf[img..]);
        let mut damaged = false;
        match self.mode {
            Mode::RcSend => {
                self.post(SendWr {
                    wr_id: id,
                    opcode: WrOpcode::Send,
                    flags: SendFlags::SIGNALED,
                    payload: softhca::Payload::Sges(smallvec![self
                        .mr
                        .sge(off, self.slot_len as u32)]),
                    ..SendWr::default()
                })?;
                self.pending.push_back(b);
                self.busy[b] = true;
            }
            _ => {
                // Loss emulation as a UC responder would see it: packets before the
                // first lost one are placed, the rest of the message is dropped
                // (IBTA 9.7.5.1.1), so send only that prefix.
                let mut len = self.slot_len;
                if self.loss > 0.0 {
                    let pkts = self.slot_len.div_ceil(self.mtu);
                    if let Some(k) = (0..pkts).find(|_| self.rng.chance(self.loss)) {
                        len = k * self.mtu;
                        damaged = true;
                    }
                }
                let imm_lost = self.rng.chance(self.loss);
                damaged |= imm_lost;
                let slot = id % self.ring.slots.max(1) as u64;
                let raddr = self.ring.addr + slot * self.ring.slot_len as u64;
                if len > 0 {
                    self.post(SendWr {
                        wr_id: id,
                        opcode: WrOpcode::RdmaWrite,
                        flags: if imm_lost {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::empty()
                        },
                        payload: softhca::Payload::Sges(smallvec![self.mr.sge(off, len as u32)]),
                        remote_addr: raddr,
                        rkey: self.ring.rkey,
                        ..SendWr::default()
                    })?;
                }
                if !imm_lost {
                    self.post(SendWr {
                        wr_id: id,
                        opcode: WrOpcode::RdmaWriteWithImm,
                        flags: SendFlags::SIGNALED,
                        payload: softhca::Payload::Sges(smallvec![]),
                        remote_addr: raddr,
                        rkey: self.ring.rkey,
                        imm_data: id as u32,
                        ..SendWr::default()
                    })?;
                }
                if len > 0 || !imm_lost {
                    self.pending.push_back(b);
                    self.busy[b] = true;
                }
            }
        }
        // Reap what is done without waiting.
        self.reap(Duration::ZERO)?;
        Ok(FrameSent {
            id,
            ready_ns: ts,
            damaged,
        })
    }

    fn post(&self, wr: SendWr) -> Result<(), StreamError> {
        self.qp
            .post_send(wr)
            .map_err(StreamError::verbs("post_send"))
    }
}
