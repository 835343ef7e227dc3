//! Base transport header (IBTA 9.2, 12 bytes).
//!
//! ```text
//! byte 0   OpCode
//! byte 1   SE(7) M(6) PadCnt(5:4) TVer(3:0)
//! byte 2-3 P_Key
//! byte 4   FECN(7) BECN(6) reserved(5:0)   -- RoCEv2 (A17.3.4) reuses bits 7:6 of Resv8a
//! byte 5-7 DestQP
//! byte 8   AckReq(7) reserved(6:0)
//! byte 9-11 PSN
//! ```

use crate::bytes::{array, array_mut, check_bits, put_u24, u24};
use crate::{Error, Opcode, Psn, Qpn};

/// Length of the BTH.
pub const BTH_LEN: usize = 12;

/// The default partition key (full member of the default partition), what rxe and
/// `ibv_*_pingpong` use.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Whether a received P_Key is accepted (IBTA 10.9.3): the default partition 0x7fff with
/// either membership bit. rxe knows only the default partition.
#[inline]
pub const fn pkey_ok(pkey: u16) -> bool {
    pkey & 0x7fff == 0x7fff
}

/// Base transport header fields. Reserved bits are written as zero and ignored on parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// Operation code.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request (APM; rxe sends 0... and ignores it).
    pub mig_req: bool,
    /// Pad count: bytes (0..=3) added after the payload to reach a multiple of 4.
    pub pad_count: u8,
    /// Transport header version (must be 0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward explicit congestion notification (RoCEv2 A17.9).
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination queue pair.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// The 7 reserved bits after AckReq (IBTA 9.2: sent 0, ignored by rxe). softhca sets
    /// them only towards a softhca peer that agreed to larger packets: in a READ request
    /// they give log2 of the response packet size.
    pub resv7: u8,
    /// Packet sequence number.
    pub psn: Psn,
}

impl Bth {
    /// A BTH with the default P_Key, TVer 0, pad 0 and all flags clear.
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Read the BTH at the start of `buf`. Does not judge the opcode or TVer ([`crate::parse`] does).
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<Bth, Error> {
        let b: &[u8; BTH_LEN] = array(buf, 0, "BTH")?;
        Ok(Bth {
            opcode: Opcode(b[0]),
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad_count: (b[1] >> 4) & 0x3,
            tver: b[1] & 0x0f,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: Qpn::new(u24([b[5], b[6], b[7]])),
            ack_req: b[8] & 0x80 != 0,
            resv7: b[8] & 0x7f,
            psn: Psn::new(u24([b[9], b[10], b[11]])),
        })
    }

    /// Write the BTH to the start of `buf`; returns [`BTH_LEN`].
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        check_bits("BTH PadCnt", self.pad_count.into(), 2)?;
        check_bits("BTH TVer", self.tver.into(), 4)?;
        check_bits("BTH reserved", self.resv7.into(), 7)?;
        let b: &mut [u8; BTH_LEN] = array_mut(buf, 0, "BTH")?;
        b[0] = self.opcode.0;
        b[1] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | (self.pad_count << 4)
            | self.tver;
        [b[2], b[3]] = self.pkey.to_be_bytes();
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        [b[5], b[6], b[7]] = put_u24(self.dest_qp.value());
        b[8] = (u8::from(self.ack_req) << 7) | self.resv7;
        [b[9], b[10], b[11]] = put_u24(self.psn.value());
        Ok(BTH_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_layout() {
        let mut bth = Bth::new(Opcode::RC_SEND_LAST, Qpn::new(0x123), Psn::new(0x2fad7d));
        bth.solicited = true;
        bth.pad_count = 3;
        bth.fecn = true;
        bth.ack_req = true;
        let mut b = [0u8; 12];
        assert_eq!(bth.emit(&mut b), Ok(12));
        assert_eq!(
            b,
            [0x02, 0xb0, 0xff, 0xff, 0x80, 0x00, 0x01, 0x23, 0x80, 0x2f, 0xad, 0x7d]
        );
        assert_eq!(Bth::parse(&b), Ok(bth));
    }

    #[test]
    fn pkey_check_accepts_both_memberships_of_the_default_partition() {
        assert!(pkey_ok(DEFAULT_PKEY));
        assert!(pkey_ok(0x7fff));
        assert!(!pkey_ok(0xfffe));
        assert!(!pkey_ok(0x8001));
    }

    #[test]
    fn rejects_wide_fields_and_short_buffers() {
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, Qpn::new(1), Psn::new(1));
        bth.pad_count = 4;
        let mut b = [0u8; 12];
        assert!(matches!(
            bth.emit(&mut b),
            Err(Error::FieldRange { bits: 2, .. })
        ));
        bth.pad_count = 0;
        assert!(matches!(
            bth.emit(&mut b[..11]),
            Err(Error::Truncated {
                need: 12,
                have: 11,
                ..
            })
        ));
        assert!(matches!(Bth::parse(&b[..3]), Err(Error::Truncated { .. })));
    }
}
