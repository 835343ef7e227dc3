//! The engine's configuration: device limits and the choices that shape its packets.

use crate::cc::CcAlgorithm;
use crate::multipath::MpConfig;
use crate::verbs::{Gid, Mtu};

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// GID table: the addresses this device serves.
    pub gids: Vec<Gid>,
    /// RoCEv2 UDP port (4791).
    pub udp_port: u16,
    /// Seed for randomised choices (initial values only; the datapath is deterministic).
    pub seed: u64,
    /// The MTU every served interface carries: the port's active MTU, UD's MTU, and the
    /// limit of a GID with no entry in `gid_mtus`.
    pub max_mtu: Mtu,
    /// Per GID (same order as `gids`), the largest path MTU its interface carries: a
    /// connected QP's path MTU is checked against its source GID's, as rxe checks it
    /// against its one netdev's port (a device serving loopback and a 1500-byte
    /// Ethernet still runs MTU 4096 between loopback addresses).
    pub gid_mtus: Vec<Mtu>,
    /// Largest queue depth.
    pub max_qp_wr: u32,
    /// Largest scatter/gather list.
    pub max_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
    /// Largest max_rd_atomic / max_dest_rd_atomic.
    pub max_qp_rd_atom: u8,
    /// Largest number of packets per [`crate::Transmit`] (1 disables batching).
    pub max_gso_segments: usize,
    /// Send each packet of a multi-packet RC RDMA WRITE (without immediate) as an RDMA
    /// WRITE Only with a RETH for its own part, instead of First/Middle/Last.
    ///
    /// Why: a GSO batch holds equal-sized packets (the last may be shorter), and a
    /// WRITE First is 16 bytes longer than the Middles (its RETH), so a classic
    /// 64 KiB WRITE leaves as two batches, two skbs on each side. As Only packets it
    /// leaves as one. The peer sees valid single-packet WRITEs in PSN order: the same bytes
    /// land at the same places, each packet's range is checked against the rkey, and
    /// the ACKs are the same (AckReq on the WR's last packet). What differs: a WRITE
    /// that runs past the end of the remote MR has its in-bounds packets placed
    /// before the NAK (a First carries the whole length and is refused whole), and a
    /// capture shows Only packets where rxe shows First/Middle/Last. UC keeps
    /// First/Middle/Last: there a lost packet must drop the whole message.
    pub split_rc_writes: bool,
    /// The first QPN handed out; `None`: a random point of the QPN space drawn from
    /// `seed`, so that a restarted device does not reuse QPNs a peer still remembers.
    pub first_qpn: Option<u32>,
    /// Congestion control of RC QPs (see `cc`).
    pub cc: CcAlgorithm,
    /// The multipath extension (see `multipath`). Off by default here (an engine on its
    /// own sends nothing it was not asked to); softhca's `Config` turns it on.
    pub mp: MpConfig,
    /// The most each UC and UD QP sends, bytes per second on the wire; None: as fast as
    /// the application posts. They have no ACKs and so no congestion signal (see
    /// `cc`): an application on a shared or slow link sets its rate here.
    pub unacked_rate: Option<u64>,
    /// The largest bundle (several packets in one datagram, `softhca_wire::bundle`) this
    /// device receives whole, offered to peers in multipath's negotiation; bundles go
    /// only to peers that offered them too. 0 (the default here, as `mp`): none;
    /// softhca's `Config` sets its receive buffer size.
    pub bundle_max: usize,
    /// The largest packet payload (bytes, a multiple of [`JUMBO_UNIT`] above the
    /// IBTA's 4096) this device sends and receives on an RC QP whose softhca peer offered
    /// it in multipath's negotiation: SENDs, WRITEs and READ responses then take fewer
    /// packets, and less per-packet work and header bytes, where the interfaces carry
    /// frames that large (loopback, jumbo Ethernet). 0 (the default here, as `mp`): IBTA
    /// MTUs only.
    pub jumbo_mtu: u64,
}

impl EngineConfig {
    /// The largest path MTU the interface of GID `index` carries.
    pub fn gid_mtu(&self, index: u8) -> Mtu {
        self.gid_mtus
            .get(usize::from(index))
            .copied()
            .unwrap_or(self.max_mtu)
    }
}

/// Larger packet sizes are multiples of this (a READ request names its responses' size
/// in these units, in the BTH's 7 reserved bits: at most 127 of them).
pub const JUMBO_UNIT: u64 = 512;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            gids: Vec::new(),
            udp_port: 4791,
            seed: 0,
            max_mtu: Mtu::M4096,
            gid_mtus: Vec::new(),
            max_qp_wr: 16384,
            max_sge: 32,
            max_inline_data: 256,
            max_qp_rd_atom: 128,
            max_gso_segments: 64,
            split_rc_writes: true,
            first_qpn: None,
            cc: CcAlgorithm::default(),
            mp: MpConfig {
                enabled: false,
                ..MpConfig::default()
            },
            unacked_rate: None,
            bundle_max: 0,
            jumbo_mtu: 0,
        }
    }
}
