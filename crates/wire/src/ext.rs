//! Extension transport headers (IBTA 9.3): RETH, AETH, AtomicETH, AtomicAckETH, DETH,
//! ImmDt and IETH. Each reads from / writes to the start of the slice it is given.

use crate::bytes::{array, array_mut, check_bits, put_u24, u24};
use crate::{Error, Qpn};

/// RETH length.
pub const RETH_LEN: usize = 16;
/// AETH length.
pub const AETH_LEN: usize = 4;
/// AtomicETH length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// AtomicAckETH length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// DETH length.
pub const DETH_LEN: usize = 8;
/// Immediate data length.
pub const IMM_DT_LEN: usize = 4;
/// IETH length.
pub const IETH_LEN: usize = 4;

/// RDMA extended transport header (IBTA 9.3.3): target of an RDMA WRITE or READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole RDMA operation in bytes.
    pub dma_len: u32,
}

impl Reth {
    /// Read a RETH.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<Reth, Error> {
        let b: &[u8; RETH_LEN] = array(buf, 0, "RETH")?;
        let [v0, v1, v2, v3, v4, v5, v6, v7, r0, r1, r2, r3, l0, l1, l2, l3] = *b;
        Ok(Reth {
            va: u64::from_be_bytes([v0, v1, v2, v3, v4, v5, v6, v7]),
            rkey: u32::from_be_bytes([r0, r1, r2, r3]),
            dma_len: u32::from_be_bytes([l0, l1, l2, l3]),
        })
    }

    /// Write a RETH; returns [`RETH_LEN`].
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let b: &mut [u8; RETH_LEN] = array_mut(buf, 0, "RETH")?;
        let (va, rest) = b.split_at_mut(8);
        va.copy_from_slice(&self.va.to_be_bytes());
        let (rkey, len) = rest.split_at_mut(4);
        rkey.copy_from_slice(&self.rkey.to_be_bytes());
        len.copy_from_slice(&self.dma_len.to_be_bytes());
        Ok(RETH_LEN)
    }
}

/// NAK codes (IBTA 9.7.5.2.4, table 45, AETH syndrome 011x_xxxx).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    /// PSN sequence error: the responder expects a retransmission from its ePSN.
    PsnSequenceError = 0,
    /// Invalid request.
    InvalidRequest = 1,
    /// Remote access error (bad R_Key, bounds, rights).
    RemoteAccessError = 2,
    /// Remote operational error.
    RemoteOperationalError = 3,
    /// Invalid RD request.
    InvalidRdRequest = 4,
}

impl NakCode {
    /// The NAK code for the low five syndrome bits, if defined.
    pub const fn from_u8(v: u8) -> Option<NakCode> {
        match v {
            0 => Some(NakCode::PsnSequenceError),
            1 => Some(NakCode::InvalidRequest),
            2 => Some(NakCode::RemoteAccessError),
            3 => Some(NakCode::RemoteOperationalError),
            4 => Some(NakCode::InvalidRdRequest),
            _ => None,
        }
    }
}

/// What an AETH syndrome says (IBTA 9.7.5.2.4, table 44: bits 6:5 select the kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethKind {
    /// ACK with the credit count (0x1f = invalid / unlimited, what rxe sends).
    Ack {
        /// Encoded credit count (5 bits).
        credits: u8,
    },
    /// RNR NAK with the encoded minimum RNR timer (5 bits, IBTA table 45).
    RnrNak {
        /// Encoded RNR NAK timer.
        timer: u8,
    },
    /// NAK with a defined code.
    Nak(NakCode),
    /// A reserved syndrome (bit 7 set, kind 10, or an undefined NAK code): the whole byte.
    Reserved(u8),
}

/// ACK extended transport header (IBTA 9.3.5): syndrome and message sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Aeth {
    /// Syndrome byte; see [`Aeth::kind`].
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    /// Credit count meaning "invalid": end-to-end flow control not used (rxe `AETH_ACK_UNLIMITED`).
    pub const CREDITS_INVALID: u8 = 0x1f;

    /// An ACK. `msn` is masked to 24 bits, `credits` to 5.
    #[inline]
    pub const fn ack(msn: u32, credits: u8) -> Aeth {
        Aeth {
            syndrome: credits & 0x1f,
            msn: msn & 0x00ff_ffff,
        }
    }

    /// An RNR NAK with the encoded timer (5 bits).
    #[inline]
    pub const fn rnr_nak(msn: u32, timer: u8) -> Aeth {
        Aeth {
            syndrome: 0x20 | (timer & 0x1f),
            msn: msn & 0x00ff_ffff,
        }
    }

    /// A NAK.
    #[inline]
    pub const fn nak(msn: u32, code: NakCode) -> Aeth {
        Aeth {
            syndrome: 0x60 | code as u8,
            msn: msn & 0x00ff_ffff,
        }
    }

    /// The AETH that says `kind` (the inverse of [`Aeth::kind`]); `msn` is masked to 24 bits.
    #[inline]
    pub const fn from_kind(kind: AethKind, msn: u32) -> Aeth {
        match kind {
            AethKind::Ack { credits } => Aeth::ack(msn, credits),
            AethKind::RnrNak { timer } => Aeth::rnr_nak(msn, timer),
            AethKind::Nak(code) => Aeth::nak(msn, code),
            AethKind::Reserved(syndrome) => Aeth {
                syndrome,
                msn: msn & 0x00ff_ffff,
            },
        }
    }

    /// Decode the syndrome.
    #[inline]
    pub const fn kind(&self) -> AethKind {
        let s = self.syndrome;
        let low = s & 0x1f;
        match s >> 5 {
            0 => AethKind::Ack { credits: low },
            1 => AethKind::RnrNak { timer: low },
            3 => match NakCode::from_u8(low) {
                Some(c) => AethKind::Nak(c),
                None => AethKind::Reserved(s),
            },
            _ => AethKind::Reserved(s),
        }
    }

    /// Read an AETH.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<Aeth, Error> {
        let b: &[u8; AETH_LEN] = array(buf, 0, "AETH")?;
        Ok(Aeth {
            syndrome: b[0],
            msn: u24([b[1], b[2], b[3]]),
        })
    }

    /// Write an AETH; returns [`AETH_LEN`]. The MSN must fit in 24 bits.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        check_bits("AETH MSN", self.msn.into(), 24)?;
        let b: &mut [u8; AETH_LEN] = array_mut(buf, 0, "AETH")?;
        b[0] = self.syndrome;
        [b[1], b[2], b[3]] = put_u24(self.msn);
        Ok(AETH_LEN)
    }
}

/// Atomic extended transport header (IBTA 9.3.4): CmpSwap / FetchAdd request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (CmpSwap) or add value (FetchAdd).
    pub swap_add: u64,
    /// Compare value (CmpSwap; ignored by FetchAdd).
    pub compare: u64,
}

impl AtomicEth {
    /// Read an AtomicETH.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<AtomicEth, Error> {
        let b: &[u8; ATOMIC_ETH_LEN] = array(buf, 0, "AtomicETH")?;
        let [v0, v1, v2, v3, v4, v5, v6, v7, r0, r1, r2, r3, s0, s1, s2, s3, s4, s5, s6, s7, c0, c1, c2, c3, c4, c5, c6, c7] =
            *b;
        Ok(AtomicEth {
            va: u64::from_be_bytes([v0, v1, v2, v3, v4, v5, v6, v7]),
            rkey: u32::from_be_bytes([r0, r1, r2, r3]),
            swap_add: u64::from_be_bytes([s0, s1, s2, s3, s4, s5, s6, s7]),
            compare: u64::from_be_bytes([c0, c1, c2, c3, c4, c5, c6, c7]),
        })
    }

    /// Write an AtomicETH; returns [`ATOMIC_ETH_LEN`].
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let b: &mut [u8; ATOMIC_ETH_LEN] = array_mut(buf, 0, "AtomicETH")?;
        let (va, rest) = b.split_at_mut(8);
        va.copy_from_slice(&self.va.to_be_bytes());
        let (rkey, rest) = rest.split_at_mut(4);
        rkey.copy_from_slice(&self.rkey.to_be_bytes());
        let (swap, cmp) = rest.split_at_mut(8);
        swap.copy_from_slice(&self.swap_add.to_be_bytes());
        cmp.copy_from_slice(&self.compare.to_be_bytes());
        Ok(ATOMIC_ETH_LEN)
    }
}

/// Atomic ACK extended transport header (IBTA 9.3.6): the original remote value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEth {
    /// Value at the remote address before the atomic operation.
    pub orig: u64,
}

impl AtomicAckEth {
    /// Read an AtomicAckETH.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<AtomicAckEth, Error> {
        let b: &[u8; ATOMIC_ACK_ETH_LEN] = array(buf, 0, "AtomicAckETH")?;
        Ok(AtomicAckEth {
            orig: u64::from_be_bytes(*b),
        })
    }

    /// Write an AtomicAckETH; returns [`ATOMIC_ACK_ETH_LEN`].
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        *array_mut::<ATOMIC_ACK_ETH_LEN>(buf, 0, "AtomicAckETH")? = self.orig.to_be_bytes();
        Ok(ATOMIC_ACK_ETH_LEN)
    }
}

/// Datagram extended transport header (IBTA 9.3.2): UD Q_Key and source QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Source queue pair.
    pub src_qp: Qpn,
}

impl Deth {
    /// Read a DETH (the reserved byte 4 is ignored).
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<Deth, Error> {
        let b: &[u8; DETH_LEN] = array(buf, 0, "DETH")?;
        Ok(Deth {
            qkey: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            src_qp: Qpn::new(u24([b[5], b[6], b[7]])),
        })
    }

    /// Write a DETH; returns [`DETH_LEN`].
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let b: &mut [u8; DETH_LEN] = array_mut(buf, 0, "DETH")?;
        [b[0], b[1], b[2], b[3]] = self.qkey.to_be_bytes();
        b[4] = 0;
        [b[5], b[6], b[7]] = put_u24(self.src_qp.value());
        Ok(DETH_LEN)
    }
}

/// Read a 4-byte big-endian field (ImmDt, IETH R_Key) as a host `u32`.
#[inline]
pub(crate) fn parse_u32(buf: &[u8], what: &'static str) -> Result<u32, Error> {
    Ok(u32::from_be_bytes(*array::<4>(buf, 0, what)?))
}

/// Write a host `u32` as a 4-byte big-endian field (ImmDt, IETH).
#[inline]
pub(crate) fn emit_u32(v: u32, buf: &mut [u8], what: &'static str) -> Result<usize, Error> {
    *array_mut::<4>(buf, 0, what)? = v.to_be_bytes();
    Ok(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aeth_kinds() {
        assert_eq!(Aeth::ack(5, Aeth::CREDITS_INVALID).syndrome, 0x1f);
        assert_eq!(Aeth::ack(5, 3).kind(), AethKind::Ack { credits: 3 });
        assert_eq!(Aeth::rnr_nak(0, 14).syndrome, 0x2e);
        assert_eq!(Aeth::rnr_nak(0, 14).kind(), AethKind::RnrNak { timer: 14 });
        assert_eq!(Aeth::nak(7, NakCode::PsnSequenceError).syndrome, 0x60);
        assert_eq!(Aeth::nak(7, NakCode::RemoteAccessError).syndrome, 0x62);
        assert_eq!(
            Aeth::nak(7, NakCode::InvalidRdRequest).kind(),
            AethKind::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            Aeth {
                syndrome: 0x65,
                msn: 0
            }
            .kind(),
            AethKind::Reserved(0x65)
        );
        assert_eq!(
            Aeth {
                syndrome: 0x40,
                msn: 0
            }
            .kind(),
            AethKind::Reserved(0x40)
        );
        assert_eq!(
            Aeth {
                syndrome: 0x80,
                msn: 0
            }
            .kind(),
            AethKind::Reserved(0x80)
        );
        assert_eq!(Aeth::ack(0x1ff_ffff, 0).msn, 0xff_ffff);
    }

    #[test]
    fn aeth_bytes() {
        let mut b = [0u8; 4];
        assert_eq!(Aeth::rnr_nak(0x010203, 1).emit(&mut b), Ok(4));
        assert_eq!(b, [0x21, 1, 2, 3]);
        assert_eq!(
            Aeth::parse(&b),
            Ok(Aeth {
                syndrome: 0x21,
                msn: 0x010203
            })
        );
        let wide = Aeth {
            syndrome: 0,
            msn: 0x0100_0000,
        };
        assert!(matches!(
            wide.emit(&mut b),
            Err(Error::FieldRange { bits: 24, .. })
        ));
    }

    #[test]
    fn deth_and_atomic_bytes() {
        let mut b = [0xaau8; 8];
        Deth {
            qkey: 0x1111_1111,
            src_qp: Qpn::new(0x12),
        }
        .emit(&mut b)
        .unwrap();
        assert_eq!(b, [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x12]);
        let a = AtomicEth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            swap_add: 1,
            compare: 2,
        };
        let mut b = [0u8; 28];
        a.emit(&mut b).unwrap();
        assert_eq!(&b[..12], &[1, 2, 3, 4, 5, 6, 7, 8, 0xa, 0xb, 0xc, 0xd]);
        assert_eq!(b[19], 1);
        assert_eq!(b[27], 2);
        assert_eq!(AtomicEth::parse(&b), Ok(a));
        assert!(AtomicEth::parse(&b[..27]).is_err());
    }

    #[test]
    fn from_kind_inverts_kind() {
        for syndrome in 0..=255u8 {
            let a = Aeth { syndrome, msn: 5 };
            assert_eq!(Aeth::from_kind(a.kind(), 5), a);
        }
        assert_eq!(
            Aeth::from_kind(AethKind::Nak(NakCode::RemoteAccessError), 0x100_0001),
            Aeth {
                syndrome: 0x62,
                msn: 1
            }
        );
    }
}
