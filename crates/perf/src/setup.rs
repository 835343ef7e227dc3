//! Per-test resources on one side (PD, MR, CQs, QPs) and the RC connection
//! (INIT → RTR → RTS with perftest's defaults).

use std::net::IpAddr;
use std::sync::Arc;

use softhca::{
    smallvec, AccessFlags, Completion, ConnectOptions, Context, Cq, Gid, Mr, Mtu, Pd, Qp, QpCap,
    QpInit, QpType, RecvWr, RemoteQp, Sge, WcStatus,
};

use crate::error::PerfError;
use crate::exchange::{QpInfo, TestParams};

/// Bytes between slots: messages start on cache lines (and atomics on 8 bytes).
pub(crate) fn stride(size: u64) -> u64 {
    size.div_ceil(64) * 64
}

/// One side of a test: its QPs and the buffer they send from and receive into.
///
/// The buffer holds, per QP, a region of `nslots` message slots. Fields drop in
/// declaration order: QPs first, so no QP outlives the MR or CQs it names.
pub struct Side {
    /// Queue pairs, one per `--qps`.
    pub qps: Vec<Qp>,
    /// The registered buffer.
    pub mr: Mr,
    /// Send completion queue (all QPs).
    pub scq: Cq,
    /// Receive completion queue (all QPs).
    pub rcq: Cq,
    /// Protection domain (kept alive for the MR and QPs).
    _pd: Pd,
    /// The device (kept open while the test runs).
    ctx: Arc<Context>,
    /// First PSN of each QP.
    pub psns: Vec<u32>,
    /// Message size.
    pub size: u64,
    /// Slots per QP region.
    pub nslots: u64,
    /// Bytes between QP regions (0 with `--shared-buffer`: one region for all).
    region: u64,
}

/// Access every perf buffer grants (perftest registers with all of them too).
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

impl Side {
    /// Creates the resources for `p`, with `rx_depth` receive WQEs room per QP.
    pub fn create(ctx: &Arc<Context>, p: &TestParams, rx_depth: u32) -> Result<Side, PerfError> {
        let size = p.size;
        let nslots = u64::from(p.slots) + 1;
        let region = stride(size) * nslots;
        let regions = if p.shared { 1 } else { u64::from(p.qps) };
        let total = region * regions;
        let len = usize::try_from(total)
            .map_err(|_| PerfError::Usage(format!("buffer of {total} bytes is too large")))?;
        let pd = ctx.alloc_pd().map_err(PerfError::verbs("alloc_pd"))?;
        let mr = pd
            .reg_mr(len, all_access())
            .map_err(PerfError::verbs(format!("reg_mr({len} bytes)")))?;
        let attr = ctx.query_device();
        let max_wr = attr.max_qp_wr.max(1);
        let send_wr = p.tx_depth.clamp(1, max_wr);
        let recv_wr = rx_depth.clamp(1, max_wr);
        let cqe = (send_wr + recv_wr)
            .saturating_mul(p.qps)
            .clamp(16, attr.max_cqe.max(16));
        let scq = ctx
            .create_cq(cqe, None)
            .map_err(PerfError::verbs("create_cq"))?;
        let rcq = ctx
            .create_cq(cqe, None)
            .map_err(PerfError::verbs("create_cq"))?;
        let mut qps = Vec::new();
        let mut psns = Vec::new();
        for _ in 0..p.qps {
            let qp = pd
                .create_qp(&QpInit {
                    qp_type: QpType::Rc,
                    send_cq: &scq,
                    recv_cq: &rcq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: send_wr,
                        max_recv_wr: recv_wr,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                })
                .map_err(PerfError::verbs("create_qp"))?;
            // INIT now: the server posts its receives before the client's QPs are known.
            qp.init_rc(Some(all_access()))
                .map_err(PerfError::verbs("modify_qp(INIT)"))?;
            psns.push(initial_psn(qp.qpn()));
            qps.push(qp);
        }
        Ok(Side {
            qps,
            mr,
            scq,
            rcq,
            _pd: pd,
            ctx: ctx.clone(),
            psns,
            size,
            nslots,
            region: if p.shared { 0 } else { region },
        })
    }

    /// Offset of `slot` in QP `qp`'s region.
    pub fn off(&self, qp: usize, slot: u64) -> u64 {
        qp as u64 * self.region + (slot % self.nslots) * stride(self.size)
    }

    /// Scatter/gather entry for `len` bytes at `slot` of QP `qp`.
    pub fn sge(&self, qp: usize, slot: u64, len: u64) -> Sge {
        self.mr.sge(self.off(qp, slot) as usize, len as u32)
    }

    /// The connection data of each QP, sending from GID `gid`.
    pub fn infos(&self, gid: Gid) -> Vec<QpInfo> {
        self.qps
            .iter()
            .enumerate()
            .map(|(i, qp)| QpInfo {
                qpn: qp.qpn(),
                psn: self.psns[i],
                gid,
                rkey: self.mr.rkey(),
                va: self.mr.addr() + self.off(i, 0),
                len: self.region,
            })
            .collect()
    }

    /// Posts a receive for `len` bytes into `slot` of QP `qp` (`len` 0: no scatter entry,
    /// as for RDMA WRITE with immediate).
    pub fn post_recv(&self, qp: usize, slot: u64, len: u64) -> Result<(), PerfError> {
        let sg_list = if len == 0 {
            smallvec![]
        } else {
            smallvec![self.sge(qp, slot, len)]
        };
        self.qps[qp]
            .post_recv(RecvWr {
                wr_id: wr_id(qp, slot),
                sg_list,
            })
            .map_err(PerfError::verbs("post_recv"))
    }

    /// Packets the device has sent and received so far: whether a peer that owes us
    /// nothing on the control channel (a passive WRITE/READ server) is still at work.
    pub fn traffic(&self) -> u64 {
        self.ctx
            .counters()
            .into_iter()
            .filter(|(k, _)| matches!(*k, "sent_pkts" | "rcvd_pkts"))
            .map(|(_, v)| v)
            .sum()
    }

    /// Moves every QP to RTS connected to `remote` (perftest's attributes).
    pub fn connect(&self, remote: &[QpInfo], gid_index: u8, mtu: Mtu) -> Result<(), PerfError> {
        // Outstanding READs / atomics: the device's most, as perftest's default (`-o`).
        let rd_atomic = self
            .ctx
            .query_device()
            .max_qp_rd_atom
            .clamp(1, u32::from(u8::MAX)) as u8;
        let opts = ConnectOptions {
            rd_atomic,
            ..ConnectOptions::default()
        };
        for (i, (qp, r)) in self.qps.iter().zip(remote).enumerate() {
            let peer = RemoteQp {
                qpn: r.qpn,
                psn: r.psn,
                gid: r.gid,
            };
            qp.ready_rc(self.psns[i], &peer, mtu, gid_index, &opts)
                .map_err(PerfError::verbs("modify_qp(RTR/RTS)"))?;
        }
        Ok(())
    }
}

/// The GID index to send from towards `peer`: the one that routes there, or the only one.
pub fn pick_gid(ctx: &Context, peer: IpAddr) -> Result<(u8, Gid), PerfError> {
    let gids = ctx.gids();
    let idx = match ctx.gid_index_for(peer) {
        Some(i) => i,
        None if gids.len() == 1 => 0,
        None => {
            return Err(PerfError::Usage(format!(
                "no GID of {} routes to {peer}",
                ctx.name()
            )))
        }
    };
    let gid = gids
        .get(usize::from(idx))
        .copied()
        .ok_or_else(|| PerfError::Usage(format!("{} has no GID {idx}", ctx.name())))?;
    Ok((idx, gid))
}

/// A PSN that differs between runs and QPs (perftest uses lrand48; any 24-bit value works).
fn initial_psn(qpn: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (qpn.wrapping_mul(0x9E37_79B1) ^ t ^ std::process::id().rotate_left(8)) & 0xFF_FFFF
}

/// Work request id: QP index in the high 16 bits, message or slot index below.
pub fn wr_id(qp: usize, n: u64) -> u64 {
    ((qp as u64) << 48) | (n & 0xFFFF_FFFF_FFFF)
}

/// Splits a work request id into (QP index, message or slot).
pub fn split_wr_id(id: u64) -> (usize, u64) {
    ((id >> 48) as usize, id & 0xFFFF_FFFF_FFFF)
}

/// Fails on an unsuccessful completion.
pub fn check_wc(wc: &Completion, op: &'static str) -> Result<(), PerfError> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(PerfError::Completion {
            op,
            qpn: wc.qp_num,
            status: wc.status,
            wr_id: wc.wr_id,
        })
    }
}

/// Polling with back-off: spin briefly, then yield (the box has 2 cores shared with the
/// datapath threads), and notice when nothing has happened for too long.
pub struct Idle {
    spins: u32,
    last: std::time::Instant,
    limit: std::time::Duration,
    /// When [`Idle::should_check`] last said yes.
    checked: std::time::Instant,
}

/// The longest an idle loop goes without looking at its control connection.
const CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

impl Idle {
    /// Gives up after `limit` without progress.
    pub fn new(limit: std::time::Duration) -> Idle {
        let now = std::time::Instant::now();
        Idle {
            spins: 0,
            last: now,
            limit,
            checked: now,
        }
    }

    /// Something happened.
    pub fn progress(&mut self) {
        self.spins = 0;
        self.last = std::time::Instant::now();
    }

    /// Nothing happened: back off; `Err` once stalled for longer than the limit.
    pub fn idle(&mut self, what: &str) -> Result<(), PerfError> {
        self.spins = self.spins.saturating_add(1);
        if self.spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        if self.spins & 1023 == 0 && self.last.elapsed() > self.limit {
            return Err(PerfError::Timeout(format!(
                "no progress for {} s while {what}",
                self.limit.as_secs()
            )));
        }
        Ok(())
    }

    /// True every so often while idle (time to look at the control connection): every
    /// 128 turns, and at least every millisecond (a turn that sleeps, `--events`, may
    /// last that long).
    pub fn should_check(&mut self) -> bool {
        let now = std::time::Instant::now();
        let due = self.spins % 128 == 127 || now - self.checked >= CHECK_EVERY;
        if due {
            self.checked = now;
        }
        due
    }
}
