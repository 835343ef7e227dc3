//! All transport headers of one packet, and parsing / emitting a whole RoCEv2 UDP payload:
//!
//! ```text
//! BTH | ext headers (opcode order) | payload | pad (0..=3 zero bytes) | ICRC (4 bytes)
//! ```

use core::ops::Range;

use crate::bth::{Bth, BTH_LEN};
use crate::ext::{
    emit_u32, parse_u32, Aeth, AtomicAckEth, AtomicEth, Deth, Reth, AETH_LEN, ATOMIC_ACK_ETH_LEN,
    ATOMIC_ETH_LEN, DETH_LEN, IETH_LEN, IMM_DT_LEN, RETH_LEN,
};
use crate::icrc::ICRC_LEN;
use crate::{Error, ExtHeaders};

/// Pad bytes that bring a payload of `payload_len` bytes to a multiple of 4 (IBTA 9.2 PadCnt).
#[inline]
pub const fn pad_count(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}

/// The BTH and the extension headers its opcode carries. Present headers are `Some`;
/// [`Headers::emit`] checks that exactly the opcode's headers are present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Headers {
    /// Base transport header.
    pub bth: Bth,
    /// RDMA extended transport header (RDMA WRITE First/Only, READ request).
    pub reth: Option<Reth>,
    /// ACK extended transport header (ACK, Atomic ACK, READ response First/Last/Only).
    pub aeth: Option<Aeth>,
    /// Atomic extended transport header (CmpSwap, FetchAdd).
    pub atomic_eth: Option<AtomicEth>,
    /// Atomic ACK extended transport header.
    pub atomic_ack_eth: Option<AtomicAckEth>,
    /// Immediate data, the host-order value of the big-endian wire field.
    pub imm_dt: Option<u32>,
    /// IETH: the R_Key to invalidate, host order.
    pub ieth: Option<u32>,
    /// Datagram extended transport header (UD).
    pub deth: Option<Deth>,
}

impl Headers {
    /// Headers with this BTH and no extension headers (fill in the ones the opcode needs).
    pub const fn new(bth: Bth) -> Headers {
        Headers {
            bth,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            imm_dt: None,
            ieth: None,
            deth: None,
        }
    }

    /// Bytes [`Headers::emit`] writes: BTH plus the opcode's extension headers (0 if the
    /// opcode is unsupported).
    #[allow(clippy::len_without_is_empty)]
    #[inline]
    pub fn len(&self) -> usize {
        self.bth.opcode.header_len()
    }

    /// Bytes on the wire (UDP payload) of a packet with these headers and `payload_len`
    /// bytes of payload: headers, payload, pad and ICRC.
    #[inline]
    pub fn packet_len(&self, payload_len: usize) -> usize {
        self.len() + payload_len + usize::from(pad_count(payload_len)) + ICRC_LEN
    }

    /// The extension headers that are present (`Some`).
    pub fn present(&self) -> ExtHeaders {
        let mut e = ExtHeaders::empty();
        e.set(ExtHeaders::DETH, self.deth.is_some());
        e.set(ExtHeaders::RETH, self.reth.is_some());
        e.set(ExtHeaders::ATOMIC_ETH, self.atomic_eth.is_some());
        e.set(ExtHeaders::AETH, self.aeth.is_some());
        e.set(ExtHeaders::ATOMIC_ACK_ETH, self.atomic_ack_eth.is_some());
        e.set(ExtHeaders::IMM_DT, self.imm_dt.is_some());
        e.set(ExtHeaders::IETH, self.ieth.is_some());
        e
    }

    /// Check that the opcode is supported and exactly its extension headers are present.
    pub fn check(&self) -> Result<(), Error> {
        let op = self.bth.opcode;
        if !op.is_valid() {
            return Err(Error::UnsupportedOpcode(op.0));
        }
        let want = op.ext();
        let have = self.present();
        if want == have {
            return Ok(());
        }
        let (diff, problem) = match (want - have).iter().next() {
            Some(missing) => (missing, "missing"),
            None => (
                (have - want).iter().next().unwrap_or(ExtHeaders::empty()),
                "not allowed",
            ),
        };
        Err(Error::HeaderMismatch {
            opcode: op.0,
            header: ext_name(diff),
            problem,
        })
    }

    /// Write BTH and extension headers in wire order (BTH, DETH, RETH, AtomicETH, AETH,
    /// AtomicAckETH, ImmDt, IETH) to the start of `buf`; returns [`Headers::len`].
    /// The BTH is written as given (including `pad_count`; see [`emit_packet`]).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        self.check()?;
        let len = self.len();
        let have = buf.len();
        let b = buf.get_mut(..len).ok_or(Error::Truncated {
            what: "headers",
            need: len,
            have,
        })?;
        let mut at = self.bth.emit(b)?;
        if let Some(d) = &self.deth {
            at += d.emit(tail(b, at))?;
        }
        if let Some(r) = &self.reth {
            at += r.emit(tail(b, at))?;
        }
        if let Some(a) = &self.atomic_eth {
            at += a.emit(tail(b, at))?;
        }
        if let Some(a) = &self.aeth {
            at += a.emit(tail(b, at))?;
        }
        if let Some(a) = &self.atomic_ack_eth {
            at += a.emit(tail(b, at))?;
        }
        if let Some(i) = self.imm_dt {
            at += emit_u32(i, tail(b, at), "ImmDt")?;
        }
        if let Some(i) = self.ieth {
            at += emit_u32(i, tail(b, at), "IETH")?;
        }
        debug_assert_eq!(at, len);
        Ok(at)
    }

    /// Read BTH and the extension headers its opcode carries from the start of `buf`
    /// (no length, pad or TVer checks on the rest of the packet: see [`parse`]).
    pub fn parse(buf: &[u8]) -> Result<Headers, Error> {
        let bth = Bth::parse(buf)?;
        let op = bth.opcode;
        if !op.is_valid() {
            return Err(Error::UnsupportedOpcode(op.0));
        }
        let ext = op.ext();
        let mut h = Headers::new(bth);
        let mut at = BTH_LEN;
        if ext.contains(ExtHeaders::DETH) {
            h.deth = Some(Deth::parse(rest(buf, at))?);
            at += DETH_LEN;
        }
        if ext.contains(ExtHeaders::RETH) {
            h.reth = Some(Reth::parse(rest(buf, at))?);
            at += RETH_LEN;
        }
        if ext.contains(ExtHeaders::ATOMIC_ETH) {
            h.atomic_eth = Some(AtomicEth::parse(rest(buf, at))?);
            at += ATOMIC_ETH_LEN;
        }
        if ext.contains(ExtHeaders::AETH) {
            h.aeth = Some(Aeth::parse(rest(buf, at))?);
            at += AETH_LEN;
        }
        if ext.contains(ExtHeaders::ATOMIC_ACK_ETH) {
            h.atomic_ack_eth = Some(AtomicAckEth::parse(rest(buf, at))?);
            at += ATOMIC_ACK_ETH_LEN;
        }
        if ext.contains(ExtHeaders::IMM_DT) {
            h.imm_dt = Some(parse_u32(rest(buf, at), "ImmDt")?);
            at += IMM_DT_LEN;
        }
        if ext.contains(ExtHeaders::IETH) {
            h.ieth = Some(parse_u32(rest(buf, at), "IETH")?);
            at += IETH_LEN;
        }
        debug_assert_eq!(at, op.header_len());
        Ok(h)
    }
}

fn ext_name(e: ExtHeaders) -> &'static str {
    if e == ExtHeaders::DETH {
        "DETH"
    } else if e == ExtHeaders::RETH {
        "RETH"
    } else if e == ExtHeaders::ATOMIC_ETH {
        "AtomicETH"
    } else if e == ExtHeaders::AETH {
        "AETH"
    } else if e == ExtHeaders::ATOMIC_ACK_ETH {
        "AtomicAckETH"
    } else if e == ExtHeaders::IMM_DT {
        "ImmDt"
    } else {
        "IETH"
    }
}

#[inline]
fn rest(buf: &[u8], at: usize) -> &[u8] {
    buf.get(at..).unwrap_or(&[])
}

#[inline]
fn tail(buf: &mut [u8], at: usize) -> &mut [u8] {
    buf.get_mut(at..).unwrap_or(&mut [])
}

/// Parse a RoCEv2 UDP payload (BTH … payload, pad, ICRC) without copying: the headers and
/// the range of the payload in `udp_payload` (pad and ICRC excluded). Does not check the
/// ICRC (see [`crate::verify`]).
///
/// Rejects what rxe's receive path drops (`rxe_rcv`/`hdr_check`): an unsupported opcode,
/// TVer ≠ 0, a packet shorter than headers + pad + ICRC; and, stricter than rxe, a
/// packet whose length is not a multiple of 4 or payload on an opcode that has none.
pub fn parse(udp_payload: &[u8]) -> Result<(Headers, Range<usize>), Error> {
    let bth = Bth::parse(udp_payload)?;
    let op = bth.opcode;
    if !op.is_valid() {
        return Err(Error::UnsupportedOpcode(op.0));
    }
    if bth.tver != 0 {
        return Err(Error::BadTver(bth.tver));
    }
    let hl = op.header_len();
    let len = udp_payload.len();
    let need = hl + ICRC_LEN;
    let Some(end) = len.checked_sub(ICRC_LEN).filter(|_| len >= need) else {
        return Err(Error::Truncated {
            what: "headers and ICRC",
            need,
            have: len,
        });
    };
    let room = end - hl;
    let pad = usize::from(bth.pad_count);
    if pad > room {
        return Err(Error::BadPad {
            pad: bth.pad_count,
            room,
        });
    }
    if !op.has_payload() && room != 0 {
        return Err(Error::UnexpectedPayload {
            opcode: op.0,
            len: room - pad,
        });
    }
    if end % 4 != 0 {
        return Err(Error::Misaligned { len: end });
    }
    let headers = Headers::parse(udp_payload)?;
    Ok((headers, hl..end - pad))
}

/// Write `headers`, `payload` and the zero pad into `buf`, setting the BTH pad count from
/// the payload length; returns the length written (the ICRC is not included: see
/// [`crate::seal`]).
pub fn emit_packet(headers: &Headers, payload: &[u8], buf: &mut [u8]) -> Result<usize, Error> {
    let op = headers.bth.opcode;
    if !op.has_payload() && !payload.is_empty() {
        return Err(Error::UnexpectedPayload {
            opcode: op.0,
            len: payload.len(),
        });
    }
    let pad = pad_count(payload.len());
    let mut h = *headers;
    h.bth.pad_count = pad;
    let hl = h.len();
    let total = hl
        .checked_add(payload.len())
        .and_then(|n| n.checked_add(usize::from(pad)))
        .ok_or(Error::BadLength {
            field: "payload",
            value: payload.len(),
            expected: 0,
        })?;
    let have = buf.len();
    let out = buf.get_mut(..total).ok_or(Error::Truncated {
        what: "packet",
        need: total,
        have,
    })?;
    h.emit(out)?;
    let (_, body) = out.split_at_mut(hl);
    let (data, padding) = body.split_at_mut(payload.len());
    data.copy_from_slice(payload);
    padding.fill(0);
    Ok(total)
}

/// A parsed packet: headers and a borrowed payload (pad and ICRC excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// All transport headers.
    pub headers: Headers,
    /// The payload bytes.
    pub payload: &'a [u8],
}

impl<'a> Packet<'a> {
    /// [`parse`] returning the payload as a slice.
    pub fn parse(udp_payload: &'a [u8]) -> Result<Packet<'a>, Error> {
        let (headers, range) = parse(udp_payload)?;
        let payload = udp_payload.get(range).unwrap_or(&[]);
        Ok(Packet { headers, payload })
    }

    /// [`emit_packet`]: headers, payload and pad (no ICRC).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        emit_packet(&self.headers, self.payload, buf)
    }

    /// Bytes [`Packet::emit`] writes.
    pub fn len(&self) -> usize {
        self.headers.len() + self.payload.len() + usize::from(pad_count(self.payload.len()))
    }

    /// Never true: a packet has at least a BTH. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Opcode, Psn, Qpn};

    fn hdr(op: Opcode) -> Headers {
        Headers::new(Bth::new(op, Qpn::new(0x11), Psn::new(100)))
    }

    #[test]
    fn pad_counts() {
        assert_eq!([0, 1, 2, 3, 4, 5].map(pad_count), [0, 3, 2, 1, 0, 3]);
    }

    #[test]
    fn packet_len_counts_headers_payload_pad_and_icrc() {
        let h = hdr(Opcode::RC_SEND_ONLY);
        let mut buf = [0u8; 64];
        let n = emit_packet(&h, &[1, 2, 3, 4, 5], &mut buf).unwrap();
        assert_eq!(h.packet_len(5), n + ICRC_LEN);
        assert_eq!(hdr(Opcode::RC_RDMA_WRITE_FIRST).packet_len(0), 28 + 4);
    }

    #[test]
    fn check_names_missing_and_extra_headers() {
        let h = hdr(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE);
        assert_eq!(
            h.check(),
            Err(Error::HeaderMismatch {
                opcode: 0x0b,
                header: "RETH",
                problem: "missing"
            })
        );
        let mut h = hdr(Opcode::RC_SEND_ONLY);
        h.imm_dt = Some(1);
        assert_eq!(
            h.check(),
            Err(Error::HeaderMismatch {
                opcode: 0x04,
                header: "ImmDt",
                problem: "not allowed"
            })
        );
        assert_eq!(
            hdr(Opcode(0x15)).check(),
            Err(Error::UnsupportedOpcode(0x15))
        );
    }

    #[test]
    fn write_only_imm_order_is_reth_then_immdt() {
        let mut h = hdr(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE);
        h.reth = Some(Reth {
            va: 1,
            rkey: 2,
            dma_len: 3,
        });
        h.imm_dt = Some(0xdead_beef);
        let mut buf = [0u8; 64];
        let n = emit_packet(&h, &[9, 9, 9], &mut buf).unwrap();
        assert_eq!(n, 32 + 3 + 1);
        assert_eq!(&buf[12..20], &1u64.to_be_bytes());
        assert_eq!(&buf[28..32], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&buf[32..36], &[9, 9, 9, 0]);
        assert_eq!(buf[1] >> 4 & 3, 1, "pad count set from payload");
        let (p, range) = parse(&buf[..n + 4]).unwrap();
        assert_eq!(range, 32..35);
        h.bth.pad_count = 1;
        assert_eq!(p, h);
    }

    #[test]
    fn atomic_ack_order_is_aeth_then_atomic_ack_eth() {
        let mut h = hdr(Opcode::RC_ATOMIC_ACKNOWLEDGE);
        h.aeth = Some(Aeth::ack(7, Aeth::CREDITS_INVALID));
        h.atomic_ack_eth = Some(AtomicAckEth {
            orig: 0x1122_3344_5566_7788,
        });
        let mut buf = [0u8; 28];
        assert_eq!(emit_packet(&h, &[], &mut buf), Ok(24));
        assert_eq!(&buf[12..16], &[0x1f, 0, 0, 7]);
        assert_eq!(buf[16], 0x11);
        assert!(matches!(
            emit_packet(&h, &[1], &mut buf),
            Err(Error::UnexpectedPayload {
                opcode: 0x12,
                len: 1
            })
        ));
    }

    #[test]
    fn parse_rejections() {
        let mut buf = [0u8; 64];
        let n = emit_packet(&hdr(Opcode::RC_SEND_ONLY), &[1, 2, 3, 4], &mut buf).unwrap();
        assert_eq!(n, 16);
        assert!(parse(&buf[..20]).is_ok());
        assert!(matches!(parse(&buf[..15]), Err(Error::Truncated { .. })));
        assert!(matches!(
            parse(&buf[..19]),
            Err(Error::Misaligned { len: 15 })
        ));
        let mut bad = buf;
        bad[1] |= 0x01;
        assert_eq!(parse(&bad[..20]), Err(Error::BadTver(1)));
        bad = buf;
        bad[0] = 0x15;
        assert_eq!(parse(&bad[..20]), Err(Error::UnsupportedOpcode(0x15)));
        // Pad count larger than the payload.
        let n = emit_packet(&hdr(Opcode::RC_SEND_ONLY), &[], &mut buf).unwrap();
        buf[1] |= 0x30;
        assert_eq!(parse(&buf[..n + 4]), Err(Error::BadPad { pad: 3, room: 0 }));
        // An ACK with trailing bytes.
        let mut ack = hdr(Opcode::RC_ACKNOWLEDGE);
        ack.aeth = Some(Aeth::ack(1, 0));
        let n = emit_packet(&ack, &[], &mut buf).unwrap();
        assert!(parse(&buf[..n + 4]).is_ok());
        assert_eq!(
            parse(&buf[..n + 8]),
            Err(Error::UnexpectedPayload {
                opcode: 0x11,
                len: 4
            })
        );
    }
}
