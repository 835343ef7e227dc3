//! The requester's scoreboard: per request PSN in flight, where and when it went and
//! whether the responder holds it; and loss detection over it.

use std::collections::VecDeque;

use crate::cc::RttSample;
use crate::verbs::{Nanos, Psn};

use super::paths::PathState;

/// What became of a PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// Not a packet of its own (a READ's response PSNs), or sent before multipath
    /// started: plain RC recovers it.
    Untracked,
    /// Sent, no news.
    Out,
    /// Held by the responder (SACKed).
    Sacked,
    /// Found lost, queued for a resend.
    Lost,
}

/// One PSN's record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    pub mark: Mark,
    pub path: u8,
    /// Sequence number on its path.
    pub seq: u32,
    pub at: Nanos,
    /// Resent at least once (no RTT sample from it: Karn).
    pub resent: bool,
    /// The last packet the requester had to send (`RttSample::app_limited`).
    pub app_limited: bool,
    /// A READ or atomic request: its answer comes after whatever the responder owes
    /// before it (the responses of every READ ahead, paced), so neither its loss nor
    /// the path's round trip can be judged from when that comes. Plain RC's rules find
    /// it lost (a hole in the responses, the retransmit timer), and a failed path.
    pub rd_atomic: bool,
}

const UNTRACKED: Sent = Sent {
    mark: Mark::Untracked,
    path: 0,
    seq: 0,
    at: 0,
    resent: false,
    app_limited: false,
    rd_atomic: false,
};

/// Records from `base` (the oldest unacknowledged PSN) on.
#[derive(Debug, Default)]
pub(crate) struct Board {
    pub base: Psn,
    pub sent: VecDeque<Sent>,
    /// The newest send time of a packet sent once and delivered, on any path: a lost
    /// tail is judged against it (the peer and the network carried what was sent then).
    pub delivered_sent_at: Nanos,
}

/// What acknowledging or marking did, for the caller's bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// Lost PSNs to resend, in PSN order.
    pub lost: Vec<Psn>,
    /// When the next packet may be declared lost by time.
    pub next_check: Option<Nanos>,
}

impl Board {
    fn index(&self, psn: Psn) -> Option<usize> {
        usize::try_from(psn.diff(self.base)).ok()
    }

    pub fn get(&self, psn: Psn) -> Option<&Sent> {
        self.sent.get(self.index(psn)?)
    }

    /// Record that `psn` left on `path` at `now` as its `seq`-th packet there: None if
    /// it lies before the records (sent before multipath started), else the path of
    /// its previous transmission if that one was still counted in flight.
    pub fn record(
        &mut self,
        psn: Psn,
        path: u8,
        seq: u32,
        now: Nanos,
        app_limited: bool,
        rd_atomic: bool,
    ) -> Option<Option<u8>> {
        if self.sent.is_empty() {
            self.base = psn;
        }
        let i = self.index(psn)?;
        while self.sent.len() <= i {
            self.sent.push_back(UNTRACKED);
        }
        let s = self.sent.get_mut(i)?;
        let prev = (s.mark == Mark::Out).then_some(s.path);
        let prev = Some(prev);
        let resent = s.mark != Mark::Untracked || s.resent;
        *s = Sent {
            mark: Mark::Out,
            path,
            seq,
            at: now,
            resent,
            app_limited,
            rd_atomic,
        };
        prev
    }

    /// Everything before `una` is acknowledged: drop those records, crediting their
    /// paths (RTT samples from packets sent once).
    pub fn ack_to(&mut self, una: Psn, paths: &mut [PathState], now: Nanos) {
        if self.sent.is_empty() {
            self.base = una;
            return;
        }
        while self.base.is_before(una) {
            let Some(mut s) = self.sent.pop_front() else {
                self.base = una;
                break;
            };
            self.base = self.base.next();
            if s.mark == Mark::Sacked {
                // Credited when it was SACKed: its path is still alive.
                if let Some(p) = paths.get_mut(usize::from(s.path)) {
                    p.alive_at = now;
                }
            } else {
                hold(&mut s, &mut self.delivered_sent_at, paths, now);
            }
        }
    }

    /// The responder holds `first..=last`.
    pub fn sack(&mut self, first: Psn, last: Psn, paths: &mut [PathState], now: Nanos) {
        let from = if first.is_before(self.base) {
            self.base
        } else {
            first
        };
        let (Some(i), Ok(n)) = (self.index(from), usize::try_from(last.diff(from) + 1)) else {
            return;
        };
        let end = i.saturating_add(n).min(self.sent.len());
        if i >= end {
            return;
        }
        for s in self.sent.range_mut(i..end) {
            hold(s, &mut self.delivered_sent_at, paths, now);
        }
    }

    /// Find packets lost, RACK per path (RFC 8985): a path is FIFO, so a packet is lost
    /// once a packet sent after it on its own path was delivered and three later ones
    /// were, or it is older than that one's round trip plus the path's reorder window.
    /// The other paths' deliveries say nothing of it: their delays and queues differ.
    /// With nothing sent after it on its path delivered (a lost tail, a lost resend),
    /// it is lost after the path's probe timeout (RACK-TLP) once something sent after
    /// that timeout came through: a packet on any path, or a probe on its own (asked
    /// for here, `PathState::want_probe`). Time alone says nothing: a peer whose host
    /// stalls delivers nothing on any path for a while, then everything. A path that
    /// delivers nothing while others do is found silent sooner
    /// (`PathState::silent_at`).
    pub fn detect(&mut self, paths: &mut [PathState], now: Nanos) -> Found {
        let mut f = Found::default();
        let mut psn = self.base;
        let delivered = self.delivered_sent_at;
        for s in self.sent.iter_mut() {
            let this = psn;
            psn = psn.next();
            if s.mark != Mark::Out || s.rd_atomic {
                continue;
            }
            let Some(p) = paths.get_mut(usize::from(s.path)) else {
                continue;
            };
            let overtaken = s.at < p.rack_at;
            let by_seq = overtaken && p.acked_seq >= s.seq + 3;
            let due = if overtaken {
                s.at + p.rack_rtt + p.reo_wnd()
            } else {
                s.at + p.tail_wait()
            };
            if !overtaken && due <= now && delivered.max(p.probe_answered_sent) < due {
                // No news from after its timeout yet: ask its path, and judge it when
                // an answer or another delivery comes.
                if let Some(t) = p.want_probe(now) {
                    f.next_check = Some(f.next_check.map_or(t, |u: Nanos| u.min(t)));
                }
            } else if by_seq || due <= now {
                s.mark = Mark::Lost;
                p.on_lost(s.at, now);
                f.lost.push(this);
            } else {
                f.next_check = Some(f.next_check.map_or(due, |t: Nanos| t.min(due)));
            }
        }
        f
    }

    /// Mark every packet in flight on `path` lost (the path failed).
    pub fn fail_path(&mut self, path: u8, paths: &mut [PathState]) -> Vec<Psn> {
        let mut lost = Vec::new();
        let mut psn = self.base;
        for s in self.sent.iter_mut() {
            if s.mark == Mark::Out && s.path == path {
                s.mark = Mark::Lost;
                if let Some(p) = paths.get_mut(usize::from(path)) {
                    p.inflight = p.inflight.saturating_sub(1);
                    p.losses += 1;
                }
                lost.push(psn);
            }
            psn = psn.next();
        }
        lost
    }

    /// Mark every packet from `from` on that the responder does not hold as lost (a
    /// retransmit timeout): returns those to resend, lost before or now, in order.
    pub fn all_lost(&mut self, from: Psn, paths: &mut [PathState]) -> Vec<Psn> {
        let mut lost = Vec::new();
        let mut psn = self.base;
        for s in self.sent.iter_mut() {
            if !psn.is_before(from) {
                if s.mark == Mark::Out {
                    s.mark = Mark::Lost;
                    if let Some(p) = paths.get_mut(usize::from(s.path)) {
                        p.inflight = p.inflight.saturating_sub(1);
                    }
                }
                if s.mark == Mark::Lost {
                    lost.push(psn);
                }
            }
            psn = psn.next();
        }
        lost
    }

    /// Whether `psn` still needs a resend (lost, not since SACKed or acknowledged).
    pub fn needs_resend(&self, psn: Psn) -> bool {
        self.get(psn).is_some_and(|s| s.mark == Mark::Lost)
    }

    /// Forget everything (a go-back-N restart resends it all).
    pub fn clear(&mut self, paths: &mut [PathState]) {
        self.sent.clear();
        for p in paths {
            p.inflight = 0;
        }
    }
}

/// The responder holds this packet: its path is credited once (a round trip from a
/// packet sent once, and `delivered_sent_at`); one taken for lost arrived after all
/// (late, not lost: no resend needed).
fn hold(s: &mut Sent, delivered_sent_at: &mut Nanos, paths: &mut [PathState], now: Nanos) {
    match s.mark {
        Mark::Out => {
            s.mark = Mark::Sacked;
            if !s.resent && !s.rd_atomic {
                *delivered_sent_at = (*delivered_sent_at).max(s.at);
            }
            credit(s, paths, now);
        }
        Mark::Lost => {
            s.mark = Mark::Sacked;
            late(s, paths, now);
        }
        Mark::Sacked | Mark::Untracked => {}
    }
}

/// A packet taken for lost arrived before its resend left: its path is slower than
/// its round trip said (a delay that grew). Its send time is still the original one:
/// a round-trip sample, and the losses in a row that could fail the path are undone.
fn late(s: &Sent, paths: &mut [PathState], now: Nanos) {
    if let Some(p) = paths.get_mut(usize::from(s.path)) {
        if !s.resent && !s.rd_atomic {
            p.on_rtt(now.saturating_sub(s.at));
        }
        p.on_delivered(s.at, now, false);
        p.on_spurious(s.at, now);
    }
}

fn credit(s: &Sent, paths: &mut [PathState], now: Nanos) {
    if let Some(p) = paths.get_mut(usize::from(s.path)) {
        let rtt = now.saturating_sub(s.at);
        let once = !s.resent && !s.rd_atomic;
        if once {
            p.on_rtt(rtt);
            p.data_rtt = true;
        }
        p.on_delivered(s.at, now, once);
        let sample = once.then_some(RttSample {
            rtt,
            app_limited: s.app_limited,
            in_flight: 0,
        });
        p.on_acked((!s.resent).then_some(s.seq), now, sample);
    }
}

#[cfg(test)]
mod tests {
    use super::super::paths::PathStatus;
    use super::*;
    use crate::path::Path;

    fn paths(n: usize) -> Vec<PathState> {
        (0..n)
            .map(|_| {
                let mut p = PathState::new(Path::default(), PathStatus::Active, 0);
                p.srtt = 10_000;
                p
            })
            .collect()
    }

    #[test]
    fn later_packets_on_a_path_make_an_older_one_lost() {
        let mut ps = paths(2);
        let mut b = Board::default();
        for i in 0..5u32 {
            b.record(
                Psn::new(100 + i),
                0,
                i + 1,
                1000 + u64::from(i),
                false,
                false,
            );
            ps[0].inflight += 1;
        }
        // 101..=104 held: 100 has three later packets on its path acknowledged.
        b.sack(Psn::new(101), Psn::new(104), &mut ps, 2000);
        let f = b.detect(&mut ps, 2000);
        assert_eq!(f.lost, vec![Psn::new(100)]);
        assert!(b.needs_resend(Psn::new(100)));
        assert_eq!(ps[0].inflight, 0);
        // It arrives late after all: no resend.
        b.sack(Psn::new(100), Psn::new(100), &mut ps, 2100);
        assert!(!b.needs_resend(Psn::new(100)));
        b.ack_to(Psn::new(105), &mut ps, 2200);
        assert!(b.sent.is_empty());
    }

    #[test]
    fn a_packet_overtaken_on_its_own_path_is_lost_after_the_reorder_window() {
        let mut ps = paths(2);
        let mut b = Board::default();
        // Path 1 is slow (10 ms): its packet 0 is not lost for path 0's deliveries.
        b.record(Psn::new(0), 1, 1, 0, false, false);
        b.record(Psn::new(1), 0, 1, 10, false, false);
        b.record(Psn::new(2), 0, 2, 20, false, false);
        b.record(Psn::new(3), 1, 2, 30, false, false);
        ps[1].inflight = 2;
        ps[0].inflight = 2;
        b.sack(Psn::new(1), Psn::new(2), &mut ps, 1_000);
        let f = b.detect(&mut ps, 1_000);
        assert!(f.lost.is_empty());
        // Its tail waits for the probe timeout.
        assert_eq!(f.next_check, Some(ps[1].tail_wait()));
        // Packet 3, sent after it on path 1, arrives: 0 is lost a reorder window after
        // 3's round trip would have brought it.
        b.sack(Psn::new(3), Psn::new(3), &mut ps, 10_030);
        let f = b.detect(&mut ps, 10_030);
        assert!(f.lost.is_empty());
        let due = ps[1].rack_rtt + ps[1].reo_wnd();
        assert_eq!(f.next_check, Some(due));
        let f = b.detect(&mut ps, due);
        assert_eq!(f.lost, vec![Psn::new(0)]);
        assert_eq!(ps[1].losses, 1);
        // It arrives late after all: the path's reorder window grows.
        b.sack(Psn::new(0), Psn::new(0), &mut ps, due + 100);
        assert_eq!(ps[1].spurious, 1);
        assert_eq!(ps[1].reo_mult, 2);
        b.record(Psn::new(4), 0, 3, due, false, false);
        assert!(b.fail_path(0, &mut ps).contains(&Psn::new(4)));
    }
}
