//! Direct receive: the payload of the next in-order packets of a message lands in
//! registered memory straight from the socket, and the ICRC is checked over it there.
//!
//! The receiver looks at the headers of the next datagram first (`MSG_PEEK`, or, inside
//! a message, guesses them: the next PSN), asks
//! [`Engine::direct_plan`] where the payload of that packet goes, and receives each
//! segment with a scatter list [headers | registered memory | ICRC]; then it hands each
//! segment to [`Engine::handle_datagram_placed`], which checks it and executes it as
//! [`Engine::handle_datagram`] would, without copying the payload again.
//!
//! Why this never shows bytes that RC/UC semantics do not allow. A plan is made only
//! for a SEND Middle or Last (no immediate) or a WRITE Middle at the expected PSN of a
//! message whose First packet has already been checked and executed, or for a SEND
//! First at the expected PSN when the QP's own receive queue (not a shared one, whose
//! head a SEND of another QP in the same datagram may take first) has a WQE; and it
//! covers only what that message may still write: a WRITE's remaining RETH range
//! (checked against the rkey when the First came) but its last byte, which programs
//! poll for the WRITE's arrival (so its Last lands only once checked), or the rest of
//! the current SGE of the receive WQE the SEND consumes or will consume. On the
//! requester, a plan is made for the READ response at the PSN the oldest outstanding
//! READ expects next, covering the rest of that READ's local buffer: a READ's target is
//! undefined until the READ completes, and a response that fails is asked for again
//! (the READ is resent from that PSN) and rewrites what it left. A WRITE First or Only
//! is never planned: its RETH, which says where it goes, is not checked before its ICRC
//! is. The receiver aims at most that many bytes, in order, at registered memory,
//! whatever the segments turn out to hold. So a segment that fails its ICRC, is out of
//! order, or is not the packet predicted (another message, a duplicate, a Last with
//! immediate) has written only inside the target of an incomplete WRITE or of a receive
//! whose completion has not been reported; it is then checked and executed from a copy
//! as any received packet is (and dropped if its ICRC fails). What it left there is
//! rewritten by the retransmission the requester sends from the expected PSN (RC:
//! go-back-N over the rest of the message), or, when the message never completes (UC
//! drops a message with a gap; an RC QP that gives up goes to error), the range's
//! contents are undefined, as IBTA leaves them for a WRITE or receive that did not
//! complete; a NIC placing payload before the packet's end arrives does the same. One
//! thing differs from a NIC: a receive buffer longer than its message may keep, past
//! the completion's `byte_len`, bytes of the packets that followed the message in the
//! same GRO datagram (the plan's room is the whole SGE, since a Last cannot be told
//! from a Middle before it is received); a WRITE never writes past its RETH range. The
//! plan is remade from the engine's state for every segment before it is executed, so a
//! packet is executed from where it lies only if it is exactly the one predicted.
//!
//! The memory behind a plan stays registered while the engine lock is held: the
//! receiver plans, receives and hands over the segments in one hold of that lock
//! (deregistration takes it).

use std::net::IpAddr;

use softhca_wire::{self as wire, Bth, Headers, UdpPseudo, ICRC_LEN};

use crate::datagram::DatagramInfo;
use crate::engine::{same_ip, Engine};
use crate::qp::{InMsg, Qp};
use crate::verbs::*;

/// Where the payload of the next packets of a message in progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectPlan {
    /// Header bytes before each packet's payload: those of the planned packet's opcode
    /// (a SEND or WRITE Middle, a READ response Middle: the BTH only; a READ response
    /// First or Last: BTH and AETH). A later segment of the datagram with other headers
    /// is not the packet predicted, and is handled from a copy.
    pub header_len: usize,
    /// Host address of the next payload byte, in registered memory.
    pub dst: *mut u8,
    /// Bytes from `dst` the message may still write there (see the module comment).
    pub room: usize,
}

impl Qp {
    /// Where the payload of the in-order packet `bth` goes (a Middle or Last SEND or
    /// WRITE without immediate, at the expected PSN, of a message in progress, or a SEND
    /// First into the next WQE of the QP's own receive queue), and how much room that
    /// message has left there.
    fn direct_target(
        &self,
        mem: &softhca_memory::MemoryTable,
        bth: &Bth,
    ) -> Option<(*mut u8, usize)> {
        let op = bth.opcode;
        let follows = op.is_middle() || (op.is_last() && !op.has_immediate());
        // A SEND First takes the receive WQE at the head of the QP's own queue.
        let head = self.rq.front().filter(|_| self.init.srq.is_none());
        let starts = op.is_send() && op.is_first() && head.is_some();
        let ty = self.init.qp_type;
        if !(follows || starts)
            || !self.receives_in_order()
            || op.transport() != ty.transport()
            || bth.psn != self.resp.epsn
            || (ty == QpType::Uc && self.resp.uc_resync)
        {
            return None;
        }
        if starts {
            let wqe = head.filter(|_| self.resp.cur.is_none())?;
            return mem.scatter_span(self.init.pd, &wqe.sg_list, 0).ok()?;
        }
        match self.resp.cur.as_ref()? {
            InMsg::Write {
                rkey,
                va,
                remaining,
                ..
            } if op.is_write() && op.is_middle() => {
                let p = mem
                    .remote_write_span((self.init.pd, self.qpn), *rkey, *va, *remaining)
                    .ok()??;
                // Not the WRITE's last byte: programs poll it for the WRITE's arrival
                // (perftest's `ib_write_lat`), so the packet that carries it (a Last, in
                // the same GRO datagram or not) lands only once its ICRC is checked.
                Some((p, usize::try_from(remaining.checked_sub(1)?).ok()?))
            }
            InMsg::Send { wqe, off, .. } if op.is_send() => mem
                .scatter_span(self.init.pd, &wqe.sg_list, usize::try_from(*off).ok()?)
                .ok()?,
            _ => None,
        }
    }

    /// An RC or UC QP in a state that receives requests (RTR and after, before error):
    /// its responder takes packets in PSN order.
    fn receives_in_order(&self) -> bool {
        matches!(self.init.qp_type, QpType::Rc | QpType::Uc)
            && matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
    }

    /// Where the payload of READ response `bth` goes when it is the next one this QP
    /// waits for (the expected PSN of the oldest READ or atomic still outstanding, as
    /// `Completer::on_read_response` takes a response in order), and how much of the
    /// READ's local buffer is left from there: every response of a READ in flight may
    /// land in that READ's own target, which stays undefined until its completion
    /// (IBTA 9.4.5: the requester may not touch a READ's buffer before it completes).
    fn read_response_target(
        &self,
        mem: &softhca_memory::MemoryTable,
        bth: &Bth,
    ) -> Option<(*mut u8, usize)> {
        if self.init.qp_type != QpType::Rc
            || !matches!(self.state, QpState::Rts | QpState::Sqd)
            || bth.opcode.transport() != QpType::Rc.transport()
        {
            return None;
        }
        let w = self
            .req
            .sq
            .iter()
            .find(|w| w.is_rd_atomic() && !w.done && w.status.is_none())?;
        if w.wr.opcode != WrOpcode::RdmaRead || !w.contains(bth.psn) || bth.psn != w.read_next_psn {
            return None;
        }
        let off = w.offset_of(bth.psn);
        let left = usize::try_from(w.len.checked_sub(off)?).ok()?;
        let Payload::Sges(sges) = &w.wr.payload else {
            return None;
        };
        let (p, n) = mem
            .scatter_span(self.init.pd, sges, usize::try_from(off).ok()?)
            .ok()??;
        // Responses that came early are placed already and counted when the gap before
        // them fills: the room ends before the first of them, or a later segment aimed
        // there would overwrite one that is never sent again.
        let before_early = self
            .req
            .read_early
            .iter()
            .map(|p| p.diff(bth.psn))
            .filter(|&d| d > 0)
            .min()
            .map_or(usize::MAX, |d| d as usize * w.mtu as usize);
        (left > 0).then_some((p, n.min(left).min(before_early)))
    }
}

impl Engine {
    /// Where the payload of the packet whose first bytes are `head`, received from
    /// `src`, may be received straight into registered memory; `None` when it must be
    /// received into a buffer (see the module comment for what a plan allows).
    pub fn direct_plan(&self, src: IpAddr, head: &[u8]) -> Option<DirectPlan> {
        let bth = Bth::parse(head).ok()?;
        if bth.tver != 0 || bth.pad_count != 0 || !wire::pkey_ok(bth.pkey) {
            return None;
        }
        let qp = self.qps.get(&bth.dest_qp.value())?;
        if !same_ip(src, qp.path.dst.ip()) {
            return None;
        }
        let (dst, room) = if bth.opcode.is_read_response() {
            qp.read_response_target(&self.memory, &bth)?
        } else {
            qp.direct_target(&self.memory, &bth)?
        };
        Some(DirectPlan {
            header_len: bth.opcode.header_len(),
            dst,
            room,
        })
    }

    /// The packet whose first bytes are `head` is for an RC or UC QP that receives and
    /// waits for an earlier PSN: one of the packets after a loss, which the
    /// retransmission (or the next message, on UC) follows in order. Such a packet has
    /// no plan, but the stream it belongs to is plannable again once the gap is filled.
    pub fn direct_awaits_earlier(&self, head: &[u8]) -> bool {
        let Ok(bth) = Bth::parse(head) else {
            return false;
        };
        self.qps
            .get(&bth.dest_qp.value())
            .is_some_and(|qp| qp.receives_in_order() && bth.psn.is_after(qp.resp.epsn))
    }

    /// Handles one segment received by a [`DirectPlan`]: its headers `head`, its
    /// payload at `placed` (`len` bytes, in registered memory), its stored ICRC `icrc`.
    /// If it is the packet the plan predicted (remade now from the engine's state) and
    /// its ICRC matches, it executes where it lies; otherwise it is handled from a copy
    /// like any received packet (see the module comment).
    ///
    /// # Safety
    /// `placed..placed + len` lies inside the `[dst, dst + room)` of a plan this engine
    /// made, and no memory region was deregistered or re-registered since.
    pub unsafe fn handle_datagram_placed(
        &mut self,
        now: Nanos,
        info: &DatagramInfo,
        head: &[u8],
        (placed, len): (*mut u8, usize),
        icrc: [u8; ICRC_LEN],
    ) {
        // SAFETY: our contract: the range is registered memory, alive while the engine
        // is (deregistration needs `&mut self`). Another thread may write it meanwhile
        // (the application, on a buffer it must not touch): the ICRC below covers the
        // bytes read, and a mismatch drops the packet.
        let payload = unsafe { std::slice::from_raw_parts(placed.cast_const(), len) };
        let predicted = Headers::parse(head).ok().filter(|h| {
            head.len() == h.bth.opcode.header_len()
                && self
                    .direct_plan(info.src.ip(), head)
                    .is_some_and(|p| p.dst == placed && p.room >= len)
        });
        let in_place = predicted.filter(|_| {
            let (src, sport) = (info.src.ip(), info.src.port());
            let pseudo = UdpPseudo::from_addrs(src, info.dst, sport, self.cfg.udp_port, 0);
            let stored = u32::from_le_bytes(icrc);
            self.ip_ids
                .verify_predicted(&pseudo, info.src, info.segment_index, |p| {
                    wire::icrc_pieces(p, head, &[payload]) == stored
                })
        });
        match in_place {
            Some(h) => {
                self.counters.rx_direct += 1;
                self.dispatch(now, info, &h, payload, head.len() + len + ICRC_LEN);
            }
            None => {
                let mut joined = Vec::with_capacity(head.len() + len + ICRC_LEN);
                joined.extend_from_slice(head);
                joined.extend_from_slice(payload);
                joined.extend_from_slice(&icrc);
                self.handle_datagram(now, info, &joined);
            }
        }
    }
}
