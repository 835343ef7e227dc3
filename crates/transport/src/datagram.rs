//! What crosses the engine's edge with a datagram: where a received one came from
//! ([`DatagramInfo`]), and the batches of packets to send ([`Transmit`], [`TxPiece`]).

use std::net::{IpAddr, SocketAddr};

use softhca_memory::External;
use softhca_wire::{self as wire, UdpPseudo};

/// Where a received datagram came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatagramInfo {
    /// Source IP and UDP port.
    pub src: SocketAddr,
    /// Destination IP (one of our GIDs).
    pub dst: IpAddr,
    /// Index within a GRO batch (the IPv4 ID candidate for the ICRC).
    pub segment_index: u16,
    /// The IP header's TOS (IPv6: traffic class), for the GRH of a UD receive.
    pub tos: u8,
}

/// A batch of packets to send: `buf[..len]` holds `ceil(len / segment_size)` packets
/// (the last may be shorter), all to `dst` from `src`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination IP and UDP port.
    pub dst: SocketAddr,
    /// Source IP.
    pub src: IpAddr,
    /// Bytes used in the buffer.
    pub len: usize,
    /// Size of each packet but the last.
    pub segment_size: usize,
    /// UDP source port of the packets (the ICRC covers it): rxe's fixed per-QP port, or
    /// the one set by [`crate::Engine::set_source_port`].
    pub src_port: u16,
    /// The IPv4 TOS / IPv6 traffic class of the packets (the QP's or AH's GRH traffic
    /// class); the ICRC masks it (IBTA A17.4.1), so it is not sealed in.
    pub tos: u8,
    /// Every packet is an RC ACKNOWLEDGE (ACK or NAK): nothing in it is a request or a
    /// READ or atomic response, so it may leave after transmits built later (an ACK is
    /// cumulative, IBTA 9.7.5.1).
    pub only_acks: bool,
}

impl Transmit {
    /// Seals `piece`, a packet of this Transmit from [`crate::Engine::poll_transmit_gather`]
    /// (which leaves every packet unsealed), for the UDP source port and IPv4 ID it leaves
    /// with: the ICRC covers both (IBTA A17.4.1 masks neither), and only the caller knows
    /// which socket sends it. `payload` is the piece's external payload (empty when it has
    /// none): the bytes at its address, which `MemoryTable::external_payload` reads
    /// checked. Returns false when the piece is not laid out as it says.
    pub fn seal(
        &self,
        buf: &mut [u8],
        piece: &TxPiece,
        payload: &[u8],
        sport: u16,
        ipv4_id: u16,
    ) -> bool {
        let Some(pkt) = buf.get_mut(piece.start..piece.start + piece.head + piece.tail) else {
            return false;
        };
        let Some(body) = pkt.len().checked_sub(wire::ICRC_LEN) else {
            return false;
        };
        let pseudo =
            UdpPseudo::from_addrs(self.src, self.dst.ip(), sport, self.dst.port(), ipv4_id);
        match piece.external {
            None => seal_packet(&pseudo, pkt, body, piece.tail_crc).is_some(),
            Some(e) => {
                e.len == payload.len()
                    && wire::seal_pieces(&pseudo, pkt, piece.head, payload, body).is_ok()
            }
        }
    }

    /// Packets in this Transmit.
    pub fn packets(&self) -> usize {
        self.len.div_ceil(self.segment_size.max(1))
    }
}

/// One packet of a Transmit from [`crate::Engine::poll_transmit_gather`]: its wire bytes are
/// `buf[start..start + head]`, then the `external` payload if any, then
/// `buf[start + head..start + head + tail]` (pad and ICRC). Without `external` the
/// packet is simply `buf[start..start + head + tail]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPiece {
    /// Where the packet starts in the transmit buffer.
    pub start: usize,
    /// Bytes in the buffer before the external payload (the headers).
    pub head: usize,
    /// The payload left in registered memory.
    pub external: Option<External>,
    /// Bytes in the buffer after the external payload (pad, ICRC).
    pub tail: usize,
    /// The CRC of the packet's payload and pad, taken as they were copied in (an RDMA
    /// READ response's payload): sealing hashes the headers only.
    pub tail_crc: Option<TailCrc>,
}

/// The CRC-32 (initial value 0) of a packet's bytes from `at` up to its ICRC, computed
/// while they were copied into the transmit buffer (`MemoryTable::remote_read_crc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailCrc {
    /// Offset in the packet of the first byte covered (the payload's).
    pub at: usize,
    /// Their CRC-32, as crc32fast computes it from the initial value 0.
    pub crc: u32,
}

impl TxPiece {
    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.head + self.external.map_or(0, |e| e.len) + self.tail
    }
}

/// Append the ICRC to the packet `pkt[..len]`; with `tail`, hashing only its headers
/// (see [`TailCrc`]). Returns `len + 4`.
pub(crate) fn seal_packet(
    pseudo: &UdpPseudo,
    pkt: &mut [u8],
    len: usize,
    tail: Option<TailCrc>,
) -> Option<usize> {
    match tail {
        Some(t) => wire::seal_tail(pseudo, pkt, len, t.at, t.crc),
        None => wire::seal(pseudo, pkt, len),
    }
    .ok()
}
