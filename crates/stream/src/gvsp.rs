//! GigE Vision stream protocol (GVSP) packets and the GVCP PACKETRESEND command, as
//! Aravis documents them (arvgvspprivate.h / arvgvcpprivate.h). All fields big-endian.
//!
//! Extended-id GVSP header (GEV 2.0, EI flag = bit 31 of `packet_infos`), 20 bytes:
//! `status u16 | flags u16 | packet_infos u32 (EI | content type << 24) | block_id u64 |
//! packet_id u32`. Packet 0 is the leader, 1..=n payload, n+1 the trailer.
//!
//! Image leader data: `flags u16 | payload_type u16 (1 = image) | timestamp u64 |
//! pixel_format u32 | width u32 | height u32 | x_offset u32 | y_offset u32 |
//! x_padding u16 | y_padding u16` (36 bytes). Trailer data: `payload_type u32 | size_y u32`.
//!
//! GEV 1.x header (EI clear), 8 bytes: `status u16 | block_id u16 | packet_infos u32
//! (content type << 24 | packet_id, 24 bits)`; the leader and trailer data are the same.

/// Bytes of the extended-id GVSP header.
pub const HEADER_LEN: usize = 20;
/// Bytes of the GEV 1.x GVSP header (16-bit block id, 24-bit packet id), which
/// devices send unless extended ids are switched on (Aravis's fake camera does).
pub const LEGACY_HEADER_LEN: usize = 8;
/// Bytes of an image leader's data.
pub const LEADER_LEN: usize = 36;
/// Bytes of an image trailer's data.
pub const TRAILER_LEN: usize = 8;
/// EI flag in `packet_infos`.
pub const EXTENDED_ID: u32 = 0x8000_0000;
/// Status of a resent packet (Aravis: ARV_GVSP_PACKET_STATUS_PACKET_RESEND).
pub const STATUS_RESEND: u16 = 0x0100;
/// GVSP payload type "image".
pub const PAYLOAD_IMAGE: u16 = 0x0001;

/// GVSP content types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// Leader (packet 0).
    Leader,
    /// Trailer (last packet).
    Trailer,
    /// Image data.
    Payload,
}

impl Content {
    fn code(self) -> u32 {
        match self {
            Content::Leader => 1,
            Content::Trailer => 2,
            Content::Payload => 3,
        }
    }
}

/// A parsed GVSP packet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Status (0 ok, [`STATUS_RESEND`] for a resent packet).
    pub status: u16,
    /// Content type.
    pub content: Content,
    /// 64-bit block (frame) id.
    pub block_id: u64,
    /// Packet id within the block.
    pub packet_id: u32,
    /// Extended ids (20-byte header); `false` for the GEV 1.x 8-byte header, whose
    /// 16-bit block id wraps.
    pub extended: bool,
}

impl Header {
    /// Bytes of this header on the wire.
    pub fn wire_len(&self) -> usize {
        if self.extended {
            HEADER_LEN
        } else {
            LEGACY_HEADER_LEN
        }
    }
}

/// Writes a header into `out[..h.wire_len()]` (no-op if short).
pub fn write_header(out: &mut [u8], h: &Header) {
    if out.len() < h.wire_len() {
        return;
    }
    if !h.extended {
        out[0..2].copy_from_slice(&h.status.to_be_bytes());
        out[2..4].copy_from_slice(&(h.block_id as u16).to_be_bytes());
        let infos = (h.content.code() << 24) | (h.packet_id & 0x00FF_FFFF);
        out[4..8].copy_from_slice(&infos.to_be_bytes());
        return;
    }
    out[0..2].copy_from_slice(&h.status.to_be_bytes());
    out[2..4].copy_from_slice(&0u16.to_be_bytes());
    out[4..8].copy_from_slice(&(EXTENDED_ID | (h.content.code() << 24)).to_be_bytes());
    out[8..16].copy_from_slice(&h.block_id.to_be_bytes());
    out[16..20].copy_from_slice(&h.packet_id.to_be_bytes());
}

fn be32(b: &[u8], o: usize) -> Option<u32> {
    let s = b.get(o..o + 4)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}
fn be16(b: &[u8], o: usize) -> Option<u16> {
    let s = b.get(o..o + 2)?;
    Some(u16::from_be_bytes([s[0], s[1]]))
}
fn be64(b: &[u8], o: usize) -> Option<u64> {
    Some((u64::from(be32(b, o)?) << 32) | u64::from(be32(b, o + 4)?))
}

/// Parses a packet of either header form: header and its data. `None` for short
/// packets or content types this receiver does not handle.
pub fn parse(pkt: &[u8]) -> Option<(Header, &[u8])> {
    let status = be16(pkt, 0)?;
    let infos = be32(pkt, 4)?;
    let extended = infos & EXTENDED_ID != 0;
    let content = match (infos >> 24) & 0x7f {
        1 => Content::Leader,
        2 => Content::Trailer,
        3 => Content::Payload,
        _ => return None,
    };
    let h = if extended {
        Header {
            status,
            content,
            block_id: be64(pkt, 8)?,
            packet_id: be32(pkt, 16)?,
            extended,
        }
    } else {
        Header {
            status,
            content,
            block_id: u64::from(be16(pkt, 2)?),
            packet_id: infos & 0x00FF_FFFF,
            extended,
        }
    };
    Some((h, pkt.get(h.wire_len()..)?))
}

/// An image leader's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLeader {
    /// Camera timestamp (ns).
    pub timestamp: u64,
    /// PFNC pixel format.
    pub pixel_format: u32,
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
}

/// Writes leader data into `out[..LEADER_LEN]` (no-op if short).
pub fn write_leader(out: &mut [u8], l: &ImageLeader) {
    if out.len() < LEADER_LEN {
        return;
    }
    out[..LEADER_LEN].fill(0);
    out[2..4].copy_from_slice(&PAYLOAD_IMAGE.to_be_bytes());
    out[4..12].copy_from_slice(&l.timestamp.to_be_bytes());
    out[12..16].copy_from_slice(&l.pixel_format.to_be_bytes());
    out[16..20].copy_from_slice(&l.width.to_be_bytes());
    out[20..24].copy_from_slice(&l.height.to_be_bytes());
}

/// Parses leader data (image payload type only).
pub fn parse_leader(d: &[u8]) -> Option<ImageLeader> {
    if be16(d, 2)? & 0x3fff != PAYLOAD_IMAGE {
        return None;
    }
    Some(ImageLeader {
        timestamp: be64(d, 4)?,
        pixel_format: be32(d, 12)?,
        width: be32(d, 16)?,
        height: be32(d, 20)?,
    })
}

/// Writes trailer data (image payload type, `size_y` rows).
pub fn write_trailer(out: &mut [u8], size_y: u32) {
    if out.len() < TRAILER_LEN {
        return;
    }
    out[0..4].copy_from_slice(&u32::from(PAYLOAD_IMAGE).to_be_bytes());
    out[4..8].copy_from_slice(&size_y.to_be_bytes());
}

/// GVCP command key byte.
pub const GVCP_KEY: u8 = 0x42;
/// GVCP PACKETRESEND_CMD.
pub const GVCP_PACKETRESEND_CMD: u16 = 0x0040;
/// GVCP command flag: extended ids (64-bit block id, 32-bit packet ids).
pub const GVCP_FLAG_EXTENDED_IDS: u8 = 0x10;
/// Bytes of a PACKETRESEND_CMD with extended ids.
pub const RESEND_LEN: usize = 8 + 20;

/// A packet-resend request: packets `first..=last` of block `block_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResendRequest {
    /// GVCP request id.
    pub req_id: u16,
    /// Stream channel.
    pub channel: u16,
    /// Block id.
    pub block_id: u64,
    /// First packet id.
    pub first: u32,
    /// Last packet id (inclusive).
    pub last: u32,
}

/// Bytes of a GEV 1.x PACKETRESEND_CMD.
pub const LEGACY_RESEND_LEN: usize = 8 + 12;

/// Encodes a GEV 1.x PACKETRESEND_CMD: `channel u16 | block_id u16 | first u32 |
/// last u32` (packet ids 24 bits), no extended-id flag.
pub fn encode_legacy_resend(r: &ResendRequest) -> [u8; LEGACY_RESEND_LEN] {
    let mut b = [0u8; LEGACY_RESEND_LEN];
    b[0] = GVCP_KEY;
    b[2..4].copy_from_slice(&GVCP_PACKETRESEND_CMD.to_be_bytes());
    b[4..6].copy_from_slice(&12u16.to_be_bytes());
    b[6..8].copy_from_slice(&r.req_id.to_be_bytes());
    b[8..10].copy_from_slice(&r.channel.to_be_bytes());
    b[10..12].copy_from_slice(&(r.block_id as u16).to_be_bytes());
    b[12..16].copy_from_slice(&(r.first & 0x00FF_FFFF).to_be_bytes());
    b[16..20].copy_from_slice(&(r.last & 0x00FF_FFFF).to_be_bytes());
    b
}

/// Encodes a PACKETRESEND_CMD (GVCP header `key 0x42 | flags | command 0x0040 | length |
/// req_id`, then `channel u16 | block_id16 u16 (0 with extended ids) | first u32 |
/// last u32 | block_id_high u32 | block_id_low u32`).
pub fn encode_resend(r: &ResendRequest) -> [u8; RESEND_LEN] {
    let mut b = [0u8; RESEND_LEN];
    b[0] = GVCP_KEY;
    b[1] = GVCP_FLAG_EXTENDED_IDS;
    b[2..4].copy_from_slice(&GVCP_PACKETRESEND_CMD.to_be_bytes());
    b[4..6].copy_from_slice(&20u16.to_be_bytes());
    b[6..8].copy_from_slice(&r.req_id.to_be_bytes());
    b[8..10].copy_from_slice(&r.channel.to_be_bytes());
    b[12..16].copy_from_slice(&r.first.to_be_bytes());
    b[16..20].copy_from_slice(&r.last.to_be_bytes());
    b[20..28].copy_from_slice(&r.block_id.to_be_bytes());
    b
}

/// Decodes a PACKETRESEND_CMD with extended ids.
pub fn decode_resend(b: &[u8]) -> Option<ResendRequest> {
    if b.len() < RESEND_LEN
        || b[0] != GVCP_KEY
        || b[1] & GVCP_FLAG_EXTENDED_IDS == 0
        || be16(b, 2)? != GVCP_PACKETRESEND_CMD
    {
        return None;
    }
    Some(ResendRequest {
        req_id: be16(b, 6)?,
        channel: be16(b, 8)?,
        first: be32(b, 12)?,
        last: be32(b, 16)?,
        block_id: be64(b, 20)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        let h = Header {
            status: STATUS_RESEND,
            content: Content::Payload,
            block_id: 0x1_0000_0002,
            packet_id: 77,
            extended: true,
        };
        let mut b = [0u8; HEADER_LEN + 3];
        write_header(&mut b, &h);
        // EI flag and content type 3 in packet_infos.
        assert_eq!(&b[4..8], &[0x83, 0, 0, 0]);
        let (p, d) = parse(&b).unwrap();
        assert_eq!(p, h);
        assert_eq!(d.len(), 3);
        assert!(parse(&b[..10]).is_none());
    }

    #[test]
    fn legacy_header_as_aravis_sends_it() {
        // The first 12 bytes of a payload packet from arv-fake-gv-camera-0.8 (tshark).
        let pkt = [
            0x00, 0x00, 0xff, 0x79, 0x03, 0x00, 0x00, 0x01, 0x79, 0x7a, 0x7b, 0x7c,
        ];
        let (h, d) = parse(&pkt).unwrap();
        assert_eq!(
            h,
            Header {
                status: 0,
                content: Content::Payload,
                block_id: 0xff79,
                packet_id: 1,
                extended: false,
            }
        );
        assert_eq!(d, &[0x79, 0x7a, 0x7b, 0x7c]);
        let mut b = [0u8; 12];
        write_header(&mut b, &h);
        assert_eq!(&b[..8], &pkt[..8]);
        let r = encode_legacy_resend(&ResendRequest {
            req_id: 1,
            channel: 0,
            block_id: 0x1ff79,
            first: 5,
            last: 6,
        });
        assert_eq!(&r[..12], &[0x42, 0, 0, 0x40, 0, 12, 0, 1, 0, 0, 0xff, 0x79]);
    }

    #[test]
    fn leader_and_resend_roundtrip() {
        let l = ImageLeader {
            timestamp: 123456789,
            pixel_format: 0x0108_0001,
            width: 640,
            height: 480,
        };
        let mut b = [0u8; LEADER_LEN];
        write_leader(&mut b, &l);
        assert_eq!(parse_leader(&b), Some(l));
        let r = ResendRequest {
            req_id: 9,
            channel: 0,
            block_id: 1 << 40,
            first: 3,
            last: 9,
        };
        let e = encode_resend(&r);
        assert_eq!(&e[0..4], &[0x42, 0x10, 0x00, 0x40]);
        assert_eq!(decode_resend(&e), Some(r));
        assert!(decode_resend(&e[..20]).is_none());
    }
}
