//! IP-based connection management (IBTA Annex A11, as the kernel's `cma.c` does it): the
//! service ID that carries the port space and destination port, and the `cma_hdr` at the
//! start of REQ and SIDR_REQ private data that carries the IP addresses and source port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bytes::{array, put, u16_at, u8_at};
use crate::mad::ServiceId;
use crate::CmError;

/// Length of `struct cma_hdr`: version, IP version, port, two 16-byte addresses.
pub const CMA_HDR_LEN: usize = 36;
/// `CMA_VERSION`: the kernel refuses any other (`cma_save_ip_info` → -EINVAL).
pub const CMA_VERSION: u8 = 0x00;
/// Q_Key of rdma_cm UD QPs (`RDMA_UDP_QKEY`), what a SIDR_REP carries.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Mask of the port space part of an IP service ID (`RDMA_IB_IP_PS_MASK`).
pub const PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;

/// rdma_cm port spaces (`enum rdma_ucm_port_space`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum PortSpace {
    /// IPoIB-compatible UD.
    Ipoib = 0x0002,
    /// RC, the TCP-like port space (rping, ucmatose, perftest `-R`).
    Tcp = 0x0106,
    /// UD, the UDP-like port space (udaddy, perftest `-R -c UD`).
    Udp = 0x0111,
    /// Any QP type (`RDMA_PS_IB`).
    Ib = 0x013F,
}

impl PortSpace {
    /// The port space of a 16-bit value.
    pub fn from_u16(v: u16) -> Option<PortSpace> {
        match v {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            _ => None,
        }
    }
}

/// The service ID of `port` in `ps`: `ps << 16 | port` (`cma_get_service_id`). For TCP,
/// UDP and IB this is the Annex A11 form `0x0000000001 <protocol byte> <port>`.
pub fn service_id(ps: PortSpace, port: u16) -> ServiceId {
    ((ps as u64) << 16) | u64::from(port)
}

/// The port space and port of an IP service ID, or `None` if it is not one
/// (`rdma_ps_from_service_id`, `cma_port_from_service_id`).
pub fn parse_service_id(id: ServiceId) -> Option<(PortSpace, u16)> {
    if id >> 32 != 0 {
        return None;
    }
    let ps = PortSpace::from_u16((id >> 16) as u16)?;
    Some((ps, id as u16))
}

/// The rdma_cm header (`struct cma_hdr`) at the start of REQ and SIDR_REQ private data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CmaHdr {
    /// `cma_version`; 0.
    pub version: u8,
    /// The **source** port of the connecting side (`cma_format_hdr` writes `src->sin_port`;
    /// the destination port travels in the service ID).
    pub src_port: u16,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
}

impl CmaHdr {
    /// Decode from the start of private data. IPv4 addresses sit in the last 4 bytes of
    /// each 16-byte slot (`union cma_ip_addr`); the 12 pad bytes are ignored, as the
    /// kernel does. An IP version other than 4 or 6 is an error (`cma_save_ip_info`).
    pub fn parse(pd: &[u8]) -> Result<CmaHdr, CmError> {
        let version = u8_at(pd, 0)?;
        let ip_version = u8_at(pd, 1)? >> 4;
        let src_port = u16_at(pd, 2)?;
        let s: [u8; 16] = array(pd, 4)?;
        let d: [u8; 16] = array(pd, 20)?;
        let (src, dst) = match ip_version {
            4 => {
                let s4: [u8; 4] = array(&s, 12)?;
                let d4: [u8; 4] = array(&d, 12)?;
                (
                    IpAddr::V4(Ipv4Addr::from(s4)),
                    IpAddr::V4(Ipv4Addr::from(d4)),
                )
            }
            6 => (IpAddr::V6(Ipv6Addr::from(s)), IpAddr::V6(Ipv6Addr::from(d))),
            v => {
                return Err(CmError::InvalidField {
                    field: "cma_hdr.ip_version",
                    value: v.into(),
                })
            }
        };
        Ok(CmaHdr {
            version,
            src_port,
            src,
            dst,
        })
    }

    /// Encode into the first [`CMA_HDR_LEN`] bytes of `pd`. Both addresses must be of one
    /// family.
    pub fn emit(&self, pd: &mut [u8]) -> Result<(), CmError> {
        let (ver, s, d) = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4u8, v4_slot(s), v4_slot(d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6u8, s.octets(), d.octets()),
            _ => {
                return Err(CmError::InvalidField {
                    field: "cma_hdr address families",
                    value: 0,
                })
            }
        };
        put(pd, 0, &[self.version, ver << 4])?;
        put(pd, 2, &self.src_port.to_be_bytes())?;
        put(pd, 4, &s)?;
        put(pd, 20, &d)
    }
}

/// `union cma_ip_addr` for IPv4: 12 zero bytes then the address (not `::ffff:`-mapped).
fn v4_slot(a: Ipv4Addr) -> [u8; 16] {
    let mut s = [0u8; 16];
    if let Some(t) = s.get_mut(12..) {
        t.copy_from_slice(&a.octets());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_as_rping_and_udaddy_send_them() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1C06);
        assert_eq!(service_id(PortSpace::Tcp, 7471), 0x0000_0000_0106_1D2F);
        assert_eq!(service_id(PortSpace::Udp, 7174), 0x0000_0000_0111_1C06);
        assert_eq!(service_id(PortSpace::Ib, 1), 0x0000_0000_013F_0001);
        assert_eq!(service_id(PortSpace::Ipoib, 2), 0x0000_0000_0002_0002);
        for ps in [
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
            PortSpace::Ipoib,
        ] {
            for port in [0, 1, 7174, 65535] {
                assert_eq!(parse_service_id(service_id(ps, port)), Some((ps, port)));
            }
        }
        assert_eq!(parse_service_id(0x0000_0000_0107_0001), None);
        assert_eq!(parse_service_id(0x0200_0000_0106_0001), None);
    }

    #[test]
    fn cma_hdr_v4_layout() {
        let h = CmaHdr {
            version: 0,
            src_port: 0xc0de,
            src: [10, 99, 0, 1].into(),
            dst: [10, 99, 0, 2].into(),
        };
        let mut pd = [0xffu8; 40];
        h.emit(&mut pd).unwrap();
        let mut want = [0u8; 36];
        want[1] = 0x40;
        want[2] = 0xc0;
        want[3] = 0xde;
        want[16..20].copy_from_slice(&[10, 99, 0, 1]);
        want[32..36].copy_from_slice(&[10, 99, 0, 2]);
        assert_eq!(&pd[..36], &want);
        assert_eq!(
            &pd[36..],
            &[0xff; 4],
            "user data after the header untouched"
        );
        assert_eq!(CmaHdr::parse(&pd).unwrap(), h);
    }

    #[test]
    fn cma_hdr_v6_and_errors() {
        let h = CmaHdr {
            version: 0,
            src_port: 1,
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        };
        let mut pd = [0u8; 36];
        h.emit(&mut pd).unwrap();
        assert_eq!(pd[1], 0x60);
        assert_eq!(CmaHdr::parse(&pd).unwrap(), h);
        pd[1] = 0x50;
        assert!(CmaHdr::parse(&pd).is_err());
        assert!(CmaHdr::parse(&pd[..35]).is_err());
        let mixed = CmaHdr {
            dst: [1, 2, 3, 4].into(),
            ..h
        };
        assert!(mixed.emit(&mut pd).is_err());
    }
}
