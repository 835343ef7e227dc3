//! Multicast receive: a socket per group a QP of the device is attached to.
//!
//! A device's unicast sockets are bound to its addresses, so a datagram sent to a group
//! address never reaches them: each group gets a socket bound to the group and joined
//! on the device's interfaces ([`softhca_io::RoceSocket::bind_multicast`]). Groups come
//! and go with `ibv_attach_mcast` / `ibv_detach_mcast`, rarely: whoever steps (an
//! application thread or the datapath thread) and the sleeping datapath thread pick
//! the set up again when its generation changes, for one atomic load per step
//! otherwise.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use softhca_io::{self as sio, IoError, RecvBatch, RoceSocket};
use softhca_transport::{DatagramInfo, Engine, Gid};

use super::schedule::DatapathShared;
use crate::Nanos;

/// Datagrams per `recvmmsg` on a group's socket.
const MCAST_BATCH: usize = 8;

/// The device's group sockets (behind [`DatapathShared::mcast`]).
#[derive(Default)]
pub(crate) struct McastSockets {
    sockets: Mutex<Vec<(Gid, Arc<RoceSocket>)>>,
    /// Changes whenever `sockets` does (0: never had any).
    generation: AtomicU64,
}

impl McastSockets {
    /// Makes the sockets those of `groups()` (read under this set's lock, so that
    /// concurrent attaches cannot undo each other): opens the missing ones with `open`,
    /// closes those of groups gone. On an error the sockets opened so far stay.
    pub(crate) fn sync(
        &self,
        groups: impl FnOnce() -> Vec<Gid>,
        open: impl Fn(Gid) -> Result<RoceSocket, IoError>,
    ) -> Result<(), IoError> {
        let mut sockets = self.sockets.lock();
        let groups = groups();
        let before = sockets.len();
        sockets.retain(|(g, _)| groups.contains(g));
        let mut changed = sockets.len() != before;
        let mut result = Ok(());
        for g in groups {
            if sockets.iter().any(|(have, _)| *have == g) {
                continue;
            }
            match open(g) {
                Ok(s) => {
                    sockets.push((g, Arc::new(s)));
                    changed = true;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if changed {
            self.generation.fetch_add(1, Ordering::Release);
        }
        result
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The sockets as of now, and their generation.
    fn snapshot(&self) -> (u64, Vec<Arc<RoceSocket>>) {
        let sockets = self.sockets.lock();
        let generation = self.generation();
        (generation, sockets.iter().map(|(_, s)| s.clone()).collect())
    }
}

/// A set of the group sockets as one thread last picked it up.
#[derive(Default)]
pub(super) struct Picked {
    generation: u64,
    pub sockets: Vec<Arc<RoceSocket>>,
}

impl Picked {
    /// Picks the set up again if it changed; returns the sockets dropped, if it did.
    pub fn refresh(&mut self, shared: &DatapathShared) -> Option<Vec<Arc<RoceSocket>>> {
        if shared.mcast.generation() == self.generation {
            return None;
        }
        let (generation, sockets) = shared.mcast.snapshot();
        self.generation = generation;
        Some(std::mem::replace(&mut self.sockets, sockets))
    }
}

/// A step's receive from the group sockets.
#[derive(Default)]
pub(super) struct McastRx {
    picked: Picked,
    batches: Vec<(RecvBatch, usize)>,
}

impl McastRx {
    /// One `recvmmsg` per group socket; returns the datagrams received.
    pub fn receive(&mut self, shared: &DatapathShared) -> usize {
        if self.picked.refresh(shared).is_some() {
            self.batches = (self.picked.sockets.iter())
                .map(|s| (RecvBatch::for_socket(s, MCAST_BATCH), 0))
                .collect();
        }
        let mut total = 0;
        for (s, (batch, n)) in self.picked.sockets.iter().zip(&mut self.batches) {
            *n = s.recv(batch).unwrap_or(0);
            total += *n;
        }
        total
    }

    /// Feeds what [`McastRx::receive`] got to the engine; returns (datagrams, packets).
    pub fn feed(&mut self, engine: &mut Engine, now: Nanos) -> (u64, u64) {
        let (mut datagrams, mut packets) = (0, 0);
        for (batch, n) in &mut self.batches {
            for k in 0..std::mem::take(n).min(batch.len()) {
                let (meta, buf) = batch.get(k);
                datagrams += 1;
                let Some(dst) = meta.dst_ip.filter(|_| !meta.truncated) else {
                    continue;
                };
                for (j, seg) in sio::segments(&meta, buf).enumerate() {
                    let info = DatagramInfo {
                        src: meta.src,
                        dst,
                        segment_index: j as u16,
                        tos: meta.tos,
                    };
                    engine.handle_datagram(now, &info, seg);
                    packets += 1;
                }
            }
        }
        (datagrams, packets)
    }
}
