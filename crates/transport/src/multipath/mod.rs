//! Multipath RC: one RC QP between two softhca devices sprays its packets over several
//! network paths, repairs loss by selective acknowledgement and retransmission, and
//! survives the failure of any path while another works. A negotiated extension: with
//! any other peer (kernel rxe, hardware) the QP is plain RoCEv2 RC, byte for byte.
//!
//! # Negotiation
//! When an RC QP (or a UC one, see below) enters RTS the engine sends one MAD to the
//! peer's QP 1 (a UD SEND with the GSI Q_Key): a Get of a vendor class (range 1, 0x0A)
//! carrying a magic, the sender's QPN, the QPN it talks to, its addresses and its
//! source-port count. Linux ib_mad answers a Get of a class nobody registered with
//! status UNSUPPORTED_METHOD_ATTRIB (`generate_unmatched_resp`): a "no" within a round
//! trip from kernel rxe. A softhca peer intercepts the MAD before its GSI QP (CM traffic
//! is untouched), checks that the named QP is one of the same type connected back to
//! the sender, and answers with its own addresses. Silence is retried at 2, 4, 8 ...
//! 512, 512 ms, and taken for "no" after 1.5 s (`HELLO_TRIES`): a host that pauses for
//! tens of milliseconds (a busy 2-core VM) is not a peer that never answers, and rxe answers
//! at once anyway. A valid request is itself proof that the sender speaks
//! the extension, so either side's Get turns both on. The QP runs plain RC until then
//! and stays plain RC after a "no"; packets sent before the switch are repaired as
//! plain RC. The 0xE1+ opcodes below are sent only to a peer that said "yes", so rxe
//! never sees one (rxe before 2021 did not reject non-RC opcodes on RC QPs). The MAD is
//! the one packet a softhca QP adds towards rxe; the QP's own packets are unchanged.
//! The MAD also says how large a bundle (`softhca_wire::bundle`: several packets in one
//! datagram, opcode 0xE4) its sender receives; a device sends bundles only to addresses
//! whose MAD said so, in a negotiation of one of its QPs, so never to rxe. Bundles are
//! the datapath's, for every QP to that peer, whether or not multipath is active.
//! Last, the MAD offers a packet size above the IBTA's 4096 (`Hello::packet_max`,
//! `EngineConfig::jumbo_mtu`): a QP on one path whose path MTU is 4096 cuts the WQEs
//! that start after the "yes" into packets of the smaller offer (each WQE keeps the
//! size it started with, so PSNs convert to offsets per WQE), a READ request naming
//! its responses' size in the BTH's reserved bits. The responder takes such packets
//! while its QP negotiates or after a "yes", never after a "no" (rxe is held to the
//! IBTA's lengths). A UC QP negotiates too, for the larger packets only: with no
//! acknowledgements there is nothing to judge paths by, so it stays on its one path.
//!
//! # Paths
//! A path is (local IP, remote IP, UDP source port). Candidates: every local address
//! (`MpConfig::addrs`, default the device's GIDs) × every address the peer advertised,
//! of the same family (loopback ones only between loopback peers, no link-local IPv6),
//! × `MpConfig::sports` source ports (ECMP entropy: the I/O layer's extra ports,
//! `MpConfig::ports`, on a device one send-only socket per port and address), at most
//! `MAX_PATHS`. Path 0 is the address vector's and starts active; the others start
//! `Probing` and carry data only once a probe (opcode 0xE2, nonce) on that very tuple
//! was answered (0xE3, sent back on the reverse pair). With one candidate path the
//! extension stays idle: single-path traffic runs the plain RC code with nothing added
//! per packet, but for one thing: once the responder would send a sequence NAK, it
//! sends a SACK instead (and SACKs, not ACKs, until the gap fills), and the requester
//! resends only the holes (`recovery::Held`), not the whole window.
//!
//! # Wire
//! Data packets are the standard RC opcodes, unchanged (RDMA WRITEs already go as
//! self-describing WRITE Only packets, `EngineConfig::split_rc_writes`). The extension
//! adds three opcodes, each a BTH, a short body and the ICRC (tshark shows a RoCE BTH):
//! - 0xE1 SACK: BTH PSN = cumulative ACK, then the MSN and up to 32 PSN ranges the
//!   responder holds beyond it (ranges rather than a bitmap: a window of 1024 PSNs
//!   with few holes is a few ranges).
//! - 0xE2 PROBE / 0xE3 PROBE_ACK: nonce and the prober's path index.
//!
//! The responder accepts requests from any address the peer advertised (rxe's
//! `check_addr` would drop them: another reason the extension needs the peer's "yes").
//!
//! # Scheduler and congestion control
//! Each path has a smoothed RTT and variation (RFC 6298) and its own window. With
//! congestion control on (`cc`, a QP it covers), each path has its own controller and
//! pacer, `cc`'s `DelayAimd` and `Pacer` behind the `CongestionControl` interface, fed
//! with that path's round trips (from its packets' send times to their ACK or SACK,
//! Karn) and its losses; the QP's own window and pacer stand aside while the paths are
//! in use (it still learns, for the figures): one window for the QP held the sum of
//! the paths to about one path's rate. Without `cc` the window is loss-driven: one more
//! packet per acknowledged one until the first cut, one per window after; halved when
//! a second loss falls in one round trip, and the cut undone when the losses prove
//! spurious (RFC 3522). ACKs are asked for at half the least path window and when a
//! path's window is about to close. New request packets go in bursts of up to a GSO
//! batch (one batch = one 5-tuple) to the active path whose window and pacer allow and
//! with the lowest RTT (minRTT, as MPTCP's default): a slow or queueing path gets what
//! the others cannot take. A retransmission avoids the path that lost it. The responder sends each ACK or
//! SACK back on the reverse of the path the last request came in on, while that path
//! is active (the requester's RTT samples then belong to one address pair), else on
//! the next active path; READ responses rotate over the active paths by GSO batches.
//! ACKs are cumulative, so an ACK lost on a path whose reverse direction died costs
//! nothing the next ACK does not repair.
//!
//! # Loss detection (requester)
//! A scoreboard keeps, per PSN in flight, the path, per-path sequence number and send
//! time. Each path is FIFO, so loss is judged per path, RACK-style (RFC 8985): a packet
//! is lost once a packet sent after it on its own path was delivered (acknowledged or
//! SACKed) and three later ones were, or it is older than that one's round trip plus
//! the path's reorder window (a quarter of its least round trip, at least 100 µs, times
//! a multiplier that grows when a loss proves spurious, a packet taken for lost
//! arriving after all, and starts over after 16 recoveries). The other paths'
//! deliveries say nothing of it: their delays and queues differ (judged against them,
//! late packets of a slower or more queued path were taken for lost by the thousand).
//! Every ACK tells the scoreboard what the responder holds, even where the QP's oldest
//! unacknowledged PSN waits for a READ's responses. A packet with nothing sent after it
//! on its path delivered (a lost tail) is lost after twice the longest round trip the
//! path should take plus its silence allowance, once something sent after that came
//! through: a packet on any path, or a probe of its own path (sent then). Time alone is
//! no evidence: a peer whose host pauses (a loaded 2-core machine pauses processes for
//! tens of ms) delivers nothing on any path, then everything at once; judged by time,
//! every packet in flight was taken for lost and most were resent. Lost packets are
//! resent alone, on another healthy path, with AckReq. READ and atomic requests are
//! not judged by time, nor counted in a path's expected deliveries or round trips: the
//! answer comes after everything the responder owes before it (the responses of every
//! READ ahead, paced, queued at the bottleneck), so its time says nothing of the
//! request (judged by it, READs through a 5 ms queue were taken for lost by the dozen,
//! asked again, and the re-requests' responses filled the queue until the QP ended in
//! RETRY_EXC_ERR). Plain RC's rules find them lost (a hole in front of placed
//! responses, the retransmit timer), and so does their path's failure; they are
//! re-requested as plain RC does it (a READ alone), spending no retry; READ
//! responses reorder and repair as in plain RC, except that an ACK overtaking them (it
//! may come by another path) is no loss until the reorder wait has passed.
//!
//! # Silence, failure and readmission
//! A path is silent when the next packet it should deliver (the oldest sent after its
//! newest delivered one) is overdue: past its send time plus the longest round trip the
//! path should take (the last delivery's or the smoothed one, plus two variations),
//! plus an allowance (its deliveries' spacing plus four variations, at least two round
//! trips between 200 µs and 1 ms, plus what silences that were not added), while a
//! packet sent after it was delivered on another path (send times, not arrival times:
//! after a pause of the peer's host every path delivers late). It is judged at the
//! timer only, after all received datagrams were fed: after a pause of the hosts, every
//! path's deliveries arrive in one burst. A silent path's packets in flight move to the
//! other paths at once, it takes no new ones and is probed at once; a delivery or a
//! probe answer puts it back in use. Losses do not fail a path: a token bucket's queue
//! drops runs of packets but lets others through; that is congestion, for its
//! controller. A path fails after `PROBE_MISSES` unanswered probes (never the last
//! active path: that one the retransmit timer judges); a probe of an active path counts
//! as unanswered only once something sent as late came through on another path (the
//! other paths are probed when none did: the peer's host may be paused); its in-flight
//! packets move to the other paths at once and the QP stays in RTS. Active paths are
//! probed every `KEEPALIVE_NS` (which is what finds a dead ACK direction); a probe may
//! take three smoothed round trips plus variation, at least 5 ms (a probe answer waits
//! behind the data its sender receives; probes measure a path until data does, and late
//! answers still count as samples). Failed paths are probed from 1 ms, doubling to
//! `READMIT_MAX_NS`, and come back on the first answer, starting from the slowest
//! path's RTT and a new controller.
//!
//! # Retry budget
//! The QP's retransmit timer runs as in plain RC: it fires only when nothing was
//! acknowledged for the Local ACK Timeout, which with multipath means every path
//! failed. Only that spends `retry_cnt`: everything unacknowledged and not SACKed is
//! resent selectively (go-back-N when a READ or atomic is at the head), on the paths
//! still active or, with none, on each in turn. So a dead peer still ends in
//! RETRY_EXC_ERR within timeout × retries, and a path failure alone never does.
//!
//! # Reorder memory
//! The responder keeps early requests in the bounded reorder buffer plain RC already
//! has (`responder::OOO_MAX` packets and `OOO_WINDOW` PSNs per QP,
//! `DEVICE_OOO_BYTES` per device); the requester never has more than
//! `requester::MAX_UNACKED_PSNS` in flight, so everything in flight can be kept.
//!
//! # Known limits
//! - The paths' controllers are independent (uncoupled, as MPTCP's uncoupled
//!   congestion control): paths that share a bottleneck each take a share of it, so a
//!   multipath QP is not fair to a single-path flow there (RFC 6356's coupled increase
//!   is the next step).
//! - READ responses are paced by the responder's one `ResponseRate` for all paths.
//! - Without `cc`, a loss-only window in slow start can fill a deep queue faster
//!   than the smoothed RTT follows, and a path may be taken for silent once.
//! - A message completes only once its slowest path has delivered, so an application
//!   needs more posted ahead than on one path (the testbed's table posts 16 MiB).
//! - Between namespaces (`softhca-impair paths table`) two paths reach 0.97 of their
//!   sum, four about 0.7 (the 2 cores are the limit there). Four links between two
//!   hosts with four addresses each make 16 address pairs, each with a thin share of
//!   the traffic and its own silence timing; a host's scheduling noise (round-trip
//!   variations of several ms) sets how soon a silent path is found, and the longest
//!   stall after a silent cut stays tens of milliseconds there, not the one round trip
//!   of the simulated tests.

mod board;
mod glue;
mod paths;
pub(crate) mod wire;

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use crate::verbs::{Nanos, Psn};

pub(crate) use board::Board;
pub(crate) use glue::Resend;
pub(crate) use paths::{PathState, PathStatus};

/// Multipath configuration (softhca's `SOFTHCA_MP*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpConfig {
    /// Negotiate the extension (false: plain RC always, no MAD sent).
    pub enabled: bool,
    /// Local addresses multipath may use; empty: every address in the GID table.
    pub addrs: Vec<IpAddr>,
    /// UDP source ports per address pair (at least 1).
    pub sports: u8,
    /// The UDP source ports the I/O layer can send from besides the one every packet
    /// is sealed for ([`crate::Engine::set_source_port`]): the `k`-th source port of a
    /// path set is `ports[k - 1]`, left as it is in the Transmit for the I/O layer to
    /// send it from that port. Empty: ports spread from rxe's per-QP port, for an I/O
    /// layer that sends from any port (the simulator).
    pub ports: Vec<u16>,
}

impl Default for MpConfig {
    fn default() -> Self {
        MpConfig {
            enabled: true,
            addrs: Vec::new(),
            sports: 1,
            ports: Vec::new(),
        }
    }
}

/// Most paths per QP.
pub(crate) const MAX_PATHS: usize = 16;
/// Negotiation MADs sent before silence means "no" (the waits between them double from
/// [`HELLO_RETRY_NS`], at most 512 ms: 1.5 s in all).
pub(crate) const HELLO_TRIES: u8 = 10;
/// The first negotiation retry; doubles.
const HELLO_RETRY_NS: Nanos = 2_000_000;
/// Unanswered probes that fail a path.
pub(crate) const PROBE_MISSES: u8 = 2;
/// An active path is probed this often (ACK direction liveness).
pub(crate) const KEEPALIVE_NS: Nanos = 20_000_000;
/// Longest wait between probes of a failed path.
pub(crate) const READMIT_MAX_NS: Nanos = 500_000_000;
/// The queueing delay a path's controller allows above its base round trip (a single
/// path's allows 2 ms and more). A message completes once its slowest path delivered,
/// so a path's queue stalls the whole QP; and the queues' swings are what a path's
/// silence must be told from, so they set how soon a cut path is found.
pub(crate) const PATH_QUEUE_DELAY_NS: Nanos = 750_000;

/// Where a QP's negotiation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpState {
    /// Asking the peer (plain RC meanwhile).
    Negotiating,
    /// The peer speaks the extension.
    On,
    /// Plain RC for the life of the QP.
    Off,
}

/// An extension packet waiting to leave (built whole, sealed by the engine).
#[derive(Debug, Clone)]
pub(crate) struct MpPacket {
    pub src: IpAddr,
    pub dst: SocketAddr,
    pub sport: u16,
    /// The IP TOS: the QP's traffic class, as its other packets (a switch queues and
    /// marks by it), or, answering a packet for no QP, the TOS that packet came with.
    pub tos: u8,
    pub bytes: Vec<u8>,
}

/// A QP's multipath state.
#[derive(Debug)]
pub(crate) struct Multipath {
    pub state: MpState,
    pub hello_tries: u8,
    pub hello_at: Option<Nanos>,
    pub nonce: u32,
    /// The peer's advertised addresses (the AV's first).
    pub peer_addrs: Vec<IpAddr>,
    pub peer_sports: u8,
    pub paths: Vec<PathState>,
    /// Whether data uses the paths (On with more than one candidate path).
    pub active: bool,
    /// The packet size above the path MTU both ends agreed (0: none), see
    /// `Qp::jumbo`.
    pub jumbo: u64,
    pub board: Board,
    /// PSNs found lost, to resend alone.
    pub resend: VecDeque<Psn>,
    /// The path of the burst under way, and packets left in it.
    pub cur: Option<usize>,
    pub burst_left: u32,
    /// Round robin over paths for responder output.
    pub resp_rr: usize,
    /// Responder: the (local, remote) addresses the last request came in on; ACKs go
    /// back the same way while that path is active.
    pub last_rx: Option<(IpAddr, IpAddr)>,
    /// Responder: a SACK is owed.
    pub sack_due: bool,
    /// Responder: early packets kept since the last SACK.
    pub kept_since_sack: u32,
    /// When a loss may be declared by time (RACK timer).
    pub loss_at: Option<Nanos>,
    /// Sending waits for a path's pacer until then.
    pub pace_at: Option<Nanos>,
    /// Extension packets built and waiting for the engine to send.
    pub out: Vec<MpPacket>,
    pub sacks_sent: u64,
    pub sacks_rcvd: u64,
    pub resends: u64,
}

impl Multipath {
    /// Whether the responder answers with SACKs: always with multipath active; on one
    /// path with a peer that speaks the extension, once a gap was reported (`gap_reported`).
    pub fn sacks(&self, gap_reported: bool) -> bool {
        self.active || (self.state == MpState::On && gap_reported)
    }

    pub fn new(now: Nanos, nonce: u32) -> Multipath {
        Multipath {
            state: MpState::Negotiating,
            hello_tries: 0,
            hello_at: Some(now),
            nonce,
            peer_addrs: Vec::new(),
            peer_sports: 1,
            paths: Vec::new(),
            active: false,
            jumbo: 0,
            board: Board::default(),
            resend: VecDeque::new(),
            cur: None,
            burst_left: 0,
            resp_rr: 0,
            last_rx: None,
            sack_due: false,
            kept_since_sack: 0,
            loss_at: None,
            pace_at: None,
            out: Vec::new(),
            sacks_sent: 0,
            sacks_rcvd: 0,
            resends: 0,
        }
    }

    /// The next negotiation retry after `tries` MADs.
    pub fn hello_wait(tries: u8) -> Nanos {
        HELLO_RETRY_NS << tries.saturating_sub(1).min(8)
    }
}

/// One path's figures, for `softhca devinfo -v` and the perf counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpPathStats {
    /// Local address.
    pub src: IpAddr,
    /// Remote address and UDP port.
    pub dst: SocketAddr,
    /// UDP source port.
    pub sport: u16,
    /// probing, active or failed.
    pub state: &'static str,
    /// Smoothed round trip (0: none yet).
    pub srtt_ns: u64,
    /// Window in packets.
    pub cwnd: u32,
    /// Pacing rate, bytes per second (0: not paced).
    pub rate: u64,
    /// Packets in flight.
    pub inflight: u32,
    /// Request packets sent (first transmissions and retransmissions).
    pub pkts: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Packets found lost on this path.
    pub losses: u64,
    /// Of those, packets that arrived after all (late, not lost).
    pub spurious: u64,
    /// Retransmissions sent on this path.
    pub retransmits: u64,
    /// Times its packets moved to the other paths because it went silent.
    pub silences: u64,
    /// State changes (probing/active/failed).
    pub state_changes: u64,
    /// Probes sent and answered.
    pub probes: u64,
    /// Probes answered.
    pub probe_acks: u64,
}

/// A QP's multipath figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpStats {
    /// Negotiation state.
    pub state: MpState,
    /// Whether data uses several paths.
    pub active: bool,
    /// Every path.
    pub paths: Vec<MpPathStats>,
    /// SACKs sent and received.
    pub sacks_sent: u64,
    /// SACKs received.
    pub sacks_rcvd: u64,
    /// Packets resent selectively.
    pub resends: u64,
    /// The packet payload above the path MTU agreed with the peer (0: none).
    pub packet_bytes: u64,
}

impl MpState {
    /// `negotiating`, `on` or `off`.
    pub fn name(self) -> &'static str {
        match self {
            MpState::Negotiating => "negotiating",
            MpState::On => "on",
            MpState::Off => "off",
        }
    }
}

impl std::fmt::Display for MpPathStats {
    /// One line: `10.0.0.1 -> 10.0.1.2:4791 sport 49901 active srtt 84us cwnd 96
    /// rate 1.000 Gb/s inflight 12 pkts 5120 bytes 5.3 MB lost 3 (late 1) resent 2 silent 0 changes 1 probes 4/4`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {} sport {} {} srtt {}us cwnd {} rate {:.3} Gb/s inflight {} pkts {} bytes {} lost {} (late {}) resent {} silent {} changes {} probes {}/{}",
            self.src,
            self.dst,
            self.sport,
            self.state,
            self.srtt_ns / 1000,
            self.cwnd,
            self.rate as f64 * 8.0 / 1e9,
            self.inflight,
            self.pkts,
            self.bytes,
            self.losses,
            self.spurious,
            self.retransmits,
            self.silences,
            self.state_changes,
            self.probe_acks,
            self.probes,
        )
    }
}

impl std::fmt::Display for MpStats {
    /// A header line (`multipath on, 4 paths, sacks sent 3 received 12, resent 9`; on
    /// one path: `multipath on, 1 paths (idle), packets of 16384 bytes, ...`),
    /// then one line per path, indented by a tab.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "multipath {}, {} paths{}{}, sacks sent {} received {}, resent {}",
            self.state.name(),
            self.paths.len(),
            if self.active { "" } else { " (idle)" },
            match self.packet_bytes {
                0 => String::new(),
                n => format!(", packets of {n} bytes"),
            },
            self.sacks_sent,
            self.sacks_rcvd,
            self.resends,
        )?;
        for (i, p) in self.paths.iter().enumerate() {
            write!(f, "\n\tpath {i}: {p}")?;
        }
        Ok(())
    }
}
