//! Transmits leave through a socket connected to their peer.
//!
//! Why: the kernel looks the route up for every datagram sent on an unconnected socket,
//! and keeps it on a connected one. For small messages that is a large share of the
//! latency, and it shows in bulk too (on loopback a 64 KiB GSO send costs about 10 %
//! less connected: 3.6 against 4.0 µs).
//!
//! Each transmit is sealed for the connected socket's UDP source port and the IPv4 ID
//! Linux will write (see `softhca_io::ConnectedSender`) once its way is known, at send
//! time; a payload left in registered memory is read for it there (see `tx`). A
//! transmit that takes the device socket instead (no connected socket for its peer, a
//! bundle) is sealed for port 4791 and ID 0 or its GSO segment index; one from a
//! multipath source port, for that port likewise. All leave in the order the datapath
//! sends them, so a QP's packets stay in order.
//!
//! Linux numbers a connected socket's datagrams, not its packets: a GSO datagram (an
//! answer and the ACK that goes with it) takes one ID, and its segments, if the kernel
//! cuts it on the way, carry that ID plus their position. Sent as two plain datagrams
//! instead, an answer and its ACK would arrive apart, and an application that needs the
//! ACK's completion before it answers again (perftest's `ib_write_lat`) would wait for
//! the second one.
//!
//! A peer whose connected socket cannot be set up uses the device socket for
//! [`REOPEN_AFTER`], one whose send failed (the ID count is then unsure) for
//! [`RETRY_AFTER`], before a new try. `SOFTHCA_CONNECTED=0` turns the path off.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;

use crate::stats::Stats;
use softhca_io::{BindOptions, ConnectedSender, RoceSocket};
use softhca_transport::Transmit;

/// Peers with a connected socket per device; more use the device socket.
const MAX_PEERS: usize = 256;
/// How long a peer whose connected socket failed a send uses the device socket.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// How long a peer whose connected socket could not be set up uses the device socket:
/// what makes it fail (no loopback device to learn the ID through, a kernel that numbers
/// differently) does not go away soon, and each try costs a few system calls and up to
/// two probe timeouts on the datapath.
const REOPEN_AFTER: Duration = Duration::from_secs(10);

enum Slot {
    Ready {
        sender: ConnectedSender,
        /// Datagrams sealed for it in the current send and not yet handed to the kernel.
        planned: usize,
    },
    Failed {
        /// When the peer may try a connected socket again.
        until: Instant,
    },
}

/// How a transmit leaves through a connected socket (see [`Senders::way`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Way {
    pub slot: usize,
    /// The socket's UDP source port.
    pub sport: u16,
    /// The IPv4 ID of the transmit's first packet.
    pub first_id: u16,
    /// The datagrams the kernel will count for it.
    datagrams: usize,
}

/// The connected sockets of one device, by (source IP, destination).
pub(crate) struct Senders {
    enabled: bool,
    gso: bool,
    /// Buffer bytes of each socket (`Config::sockbuf`).
    sockbuf: usize,
    /// The interface the device's sockets are bound to (0: none): connected sockets
    /// leave through it too.
    bind_ifindex: u32,
    slots: Vec<Slot>,
    by_peer: HashMap<(IpAddr, SocketAddr), usize>,
}

impl Senders {
    pub(crate) fn new(enabled: bool, gso: bool, sockbuf: usize, bind_ifindex: u32) -> Senders {
        Senders {
            enabled,
            gso,
            sockbuf,
            bind_ifindex,
            slots: Vec::new(),
            by_peer: HashMap::default(),
        }
    }

    /// The connected socket `t` leaves through, if any, with the UDP source port and the
    /// IPv4 ID of its first packet to seal it for (ask in send order). Once it is sealed
    /// for it, [`Senders::planned`].
    pub(crate) fn way(&mut self, t: &Transmit, stats: &Stats) -> Option<Way> {
        // A group's datagrams leave from the device socket: a socket connected to a
        // group address learns no ID counter (`ConnectedSender::open`).
        if !self.enabled || t.src.is_unspecified() || t.dst.ip().is_multicast() {
            return None;
        }
        let slot = self.slot_for(t.src, t.dst, stats)?;
        let Slot::Ready { sender, planned } = &self.slots[slot] else {
            return None;
        };
        // Packet `i` takes the ID of its datagram plus `i`: as a GSO datagram's segment,
        // or as the `i`-th plain datagram when the socket has no GSO.
        let first_id = sender
            .next_ipv4_id()
            .wrapping_add((*planned & 0xffff) as u16);
        let datagrams = if t.packets() > 1 && sender.socket().capabilities().gso {
            1
        } else {
            t.packets()
        };
        Some(Way {
            slot,
            sport: sender.source_port(),
            first_id,
            datagrams,
        })
    }

    /// A transmit was sealed for `way`: its datagrams come before the next one's.
    pub(crate) fn planned(&mut self, way: &Way) {
        if let Some(Slot::Ready { planned, .. }) = self.slots.get_mut(way.slot) {
            *planned += way.datagrams;
        }
    }

    /// The slot's socket.
    pub(crate) fn socket(&self, slot: usize) -> Option<&RoceSocket> {
        match self.slots.get(slot) {
            Some(Slot::Ready { sender, .. }) => Some(sender.socket()),
            _ => None,
        }
    }

    /// The transmits routed to `slot` were sent (`ok`), or some were not: the ID count
    /// is then unsure and the peer uses the device socket for a while.
    pub(crate) fn sent(&mut self, slot: usize, ok: bool, transmits: usize, stats: &Stats) {
        Stats::add(&stats.tx_connected, transmits as u64);
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        match s {
            // The sender counts what the kernel took (`next_ipv4_id`).
            Slot::Ready { planned, .. } if ok => *planned = 0,
            Slot::Ready { .. } => {
                Stats::add(&stats.tx_connected_failed, 1);
                tracing::debug!("send on a connected socket failed; its peer uses the device socket for a while");
                *s = Slot::Failed {
                    until: Instant::now() + RETRY_AFTER,
                };
            }
            Slot::Failed { .. } => {}
        }
    }

    fn slot_for(&mut self, src: IpAddr, dst: SocketAddr, stats: &Stats) -> Option<usize> {
        let key = (src, dst);
        let slot = match self.by_peer.get(&key) {
            Some(&s) => s,
            None if self.by_peer.len() >= MAX_PEERS => return None,
            None => {
                self.slots.push(Slot::Failed {
                    until: Instant::now(),
                });
                let s = self.slots.len() - 1;
                self.by_peer.insert(key, s);
                s
            }
        };
        if let Slot::Failed { until } = self.slots[slot] {
            if Instant::now() < until {
                return None;
            }
            let options = BindOptions {
                allow_gso: self.gso,
                allow_gro: false,
                recv_tos: false,
                sockbuf: self.sockbuf,
                bind_ifindex: self.bind_ifindex,
            };
            self.slots[slot] = match ConnectedSender::open(src, dst, options) {
                Ok(sender) => {
                    Stats::add(&stats.tx_connected_opened, 1);
                    Slot::Ready { sender, planned: 0 }
                }
                Err(e) => {
                    Stats::add(&stats.tx_connected_failed, 1);
                    tracing::debug!("no connected socket from {src} to {dst}: {e}");
                    Slot::Failed {
                        until: Instant::now() + REOPEN_AFTER,
                    }
                }
            };
        }
        matches!(self.slots[slot], Slot::Ready { .. }).then_some(slot)
    }
}
