//! The items this crate takes from `softhca-wire` and `softhca-memory`, in one place.

pub use softhca_memory::{AccessFlags, AtomicOp, MemError, MemoryTable, MrKeys, PdId, Sge};
pub use softhca_wire::{Psn, Qpn};

/// Codec adapter: [`crate::packet::PktHdr`] to bytes and back, and the ICRC.
pub(crate) use crate::codec_wire as codec;

/// A [`Qpn`] from its 24-bit value.
pub fn qpn(v: u32) -> Qpn {
    Qpn::new(v)
}

/// The 24-bit value of a [`Qpn`].
pub fn qpn_value(q: Qpn) -> u32 {
    q.value()
}

/// rxe's UDP source port for a QP: 0xC000 | hash_32(qpn, 14).
pub fn rxe_udp_sport(qpn: u32) -> u16 {
    softhca_wire::rxe_udp_sport(Qpn::new(qpn))
}
