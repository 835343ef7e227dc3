//! What a receiver hands the application, and the bookkeeping of its ring of frame
//! buffers shared by the three modes.

use std::collections::VecDeque;

/// Whether every byte of a frame arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum FrameStatus {
    /// All bytes placed.
    Complete,
    /// Some bytes missing (UC: trailer absent; GVSP: packets never recovered).
    Incomplete,
}

/// A received frame: which ring slot holds it and what is known about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    /// Frame (block) id.
    pub id: u64,
    /// Ring slot holding the bytes (give back with the receiver's `release`).
    pub slot: usize,
    /// Camera timestamp (ns, CLOCK_MONOTONIC of the camera).
    pub timestamp_ns: u64,
    /// When the receiver saw the frame complete (ns, CLOCK_MONOTONIC).
    pub arrival_ns: u64,
    /// Complete or incomplete.
    pub status: FrameStatus,
}

/// What to do when the application holds frames and the ring runs out of buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Drop the oldest frame not yet taken by the application and count it.
    #[default]
    DropOldest,
    /// Never drop: the camera waits (RC: RNR; UC/GVSP: credits in the loopback harness).
    Block,
}

/// Receiver counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RxCounters {
    /// Frames delivered complete.
    pub complete: u64,
    /// Frames delivered incomplete.
    pub incomplete: u64,
    /// Frames dropped because the application was slow.
    pub dropped: u64,
    /// Frame ids never seen at all (gaps in the id sequence).
    pub lost: u64,
    /// Resend requests sent (GVSP).
    pub resend_requests: u64,
    /// Packets that arrived as resends (GVSP).
    pub resent_packets: u64,
}

/// Frames ready for the application, in id order, plus the free-slot accounting that
/// decides when to drop the oldest one.
#[derive(Debug)]
pub(crate) struct ReadyQueue {
    pub ready: VecDeque<FrameInfo>,
    pub overflow: Overflow,
    /// Keep at least this many slots with the transport.
    pub min_free: usize,
    /// Highest id ever queued + 1 (for gap counting).
    pub next_id: Option<u64>,
    /// Count id gaps as lost (off when the mode counts them itself).
    pub count_gaps: bool,
}

impl ReadyQueue {
    pub fn new(overflow: Overflow, min_free: usize) -> ReadyQueue {
        ReadyQueue {
            ready: VecDeque::new(),
            overflow,
            min_free,
            next_id: None,
            count_gaps: true,
        }
    }

    /// Queues `f`, counting id gaps as lost. Frames must arrive in id order (older
    /// ones than the newest seen are still queued but not gap-counted).
    pub fn push(&mut self, f: FrameInfo, c: &mut RxCounters) {
        match self.next_id {
            Some(n) if self.count_gaps && f.id > n => c.lost += f.id - n,
            _ => {}
        }
        if !matches!(self.next_id, Some(n) if f.id < n) {
            self.next_id = Some(f.id + 1);
        }
        let pos = self
            .ready
            .iter()
            .rposition(|r| r.id < f.id)
            .map_or(0, |p| p + 1);
        self.ready.insert(pos, f);
    }

    /// With `free` slots left to the transport: the slots of frames to drop now.
    pub fn shed(&mut self, free: usize, c: &mut RxCounters) -> Vec<usize> {
        let mut out = Vec::new();
        if self.overflow == Overflow::DropOldest {
            let mut free = free;
            while free < self.min_free {
                match self.ready.pop_front() {
                    Some(f) => {
                        c.dropped += 1;
                        out.push(f.slot);
                        free += 1;
                    }
                    None => break,
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fi(id: u64, slot: usize) -> FrameInfo {
        FrameInfo {
            id,
            slot,
            timestamp_ns: 0,
            arrival_ns: 0,
            status: FrameStatus::Complete,
        }
    }

    #[test]
    fn gaps_order_and_drop_oldest() {
        let mut c = RxCounters::default();
        let mut q = ReadyQueue::new(Overflow::DropOldest, 2);
        q.push(fi(0, 0), &mut c);
        q.push(fi(3, 1), &mut c);
        q.push(fi(2, 2), &mut c); // late, goes before 3
        assert_eq!(c.lost, 2);
        let ids: Vec<u64> = q.ready.iter().map(|f| f.id).collect();
        assert_eq!(ids, vec![0, 2, 3]);
        assert_eq!(q.shed(0, &mut c), vec![0, 2]);
        assert_eq!(c.dropped, 2);
        let mut b = ReadyQueue::new(Overflow::Block, 2);
        b.push(fi(0, 0), &mut c);
        assert!(b.shed(0, &mut c).is_empty());
    }
}
