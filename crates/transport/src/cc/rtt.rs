//! Round-trip samples from the sender's own clock: the send time of each ACK-requesting
//! packet, matched by PSN to the ACK or response that covers it (rxe echoes no
//! timestamp, so nothing else is available with every peer).

use std::collections::VecDeque;

use super::RttSample;
use crate::verbs::{Nanos, Psn};

/// Most send times kept: one per ACK request in flight (a 1024-PSN window asks every
/// 32 packets, or once per message); older ones are dropped, costing only samples.
const MAX_SAMPLES: usize = 256;

/// A packet in flight that asks for an ACK.
#[derive(Debug, Clone, Copy)]
struct Sent {
    psn: Psn,
    at: Nanos,
    /// See `RttSample`.
    app_limited: bool,
    in_flight: u64,
}

/// Send times of packets in flight that ask for an ACK, in PSN order, each with
/// whether the requester had nothing more to send after it and what was in flight.
#[derive(Debug, Default, Clone)]
pub(crate) struct RttSampler {
    sent: VecDeque<Sent>,
}

impl RttSampler {
    /// A first transmission of `psn` that asks for an ACK, at `now`; `app_limited`: the
    /// last packet the requester had to send; `in_flight`: bytes in flight with it.
    pub fn on_sent(&mut self, psn: Psn, now: Nanos, app_limited: bool, in_flight: u64) {
        if self.sent.len() >= MAX_SAMPLES {
            self.sent.pop_front();
        }
        self.sent.push_back(Sent {
            psn,
            at: now,
            app_limited,
            in_flight,
        });
    }

    /// Everything before `una` is acknowledged at `now`: the round trip of the newest
    /// packet that covers (the fresher sample; older ones waited behind it).
    pub fn on_acked(&mut self, una: Psn, now: Nanos) -> Option<RttSample> {
        let mut rtt = None;
        while let Some(&s) = self.sent.front() {
            if !s.psn.is_before(una) {
                break;
            }
            self.sent.pop_front();
            rtt = Some(RttSample {
                rtt: now.saturating_sub(s.at),
                app_limited: s.app_limited,
                in_flight: s.in_flight,
            });
        }
        rtt
    }

    /// A retransmission started: an ACK may now answer either copy (Karn's rule).
    pub fn clear(&mut self) {
        self.sent.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_acks_by_psn_across_the_wrap() {
        let mut s = RttSampler::default();
        s.on_sent(Psn::new(0xff_fffe), 100, false, 4096);
        s.on_sent(Psn::new(2), 300, true, 8192);
        s.on_sent(Psn::new(10), 400, false, 4096);
        assert_eq!(s.on_acked(Psn::new(0xff_fffe), 500), None);
        let got = s.on_acked(Psn::new(3), 1000);
        assert_eq!(
            got,
            Some(RttSample {
                rtt: 700,
                app_limited: true,
                in_flight: 8192,
            })
        );
        s.clear();
        assert_eq!(s.on_acked(Psn::new(11), 2000), None);
    }
}
