//! Event channels: a real fd per channel, as the kernel's `/dev/infiniband/rdma_cm` file.
//!
//! The fd is an eventfd that is readable exactly while events are queued (the queue lock
//! keeps "counter > 0" and "queue not empty" in step), so `poll`/`epoll` on
//! `channel->fd` see what they would see on the kernel's fd. `rdma_get_cm_event` blocks
//! while the fd is blocking, gives `EAGAIN` once the program set `O_NONBLOCK`, and
//! `EINTR` when a signal interrupts the wait, as the kernel's `ucma_get_event` does.

use std::collections::VecDeque;
use std::ffi::c_int;

use parking_lot::Mutex;

use crate::abi::rdma_event_channel;
use crate::error::{Error, Result};
use crate::id::{IdPriv, IdRef};

/// What the CM side queues for the program (converted to an `rdma_cm_event` when read).
pub(crate) struct Pending {
    /// `event->id` (for CONNECT_REQUEST the new id).
    pub id: IdRef,
    /// `event->listen_id` for CONNECT_REQUEST; the id that counts the ack.
    pub listen: Option<IdRef>,
    pub event: c_int,
    pub status: c_int,
    pub param: Param,
    /// A REP for an active id: the QP transitions and the RTU happen when the program
    /// reads the event, as librdmacm's `ucma_process_conn_resp` does.
    pub rep: bool,
}

/// Event parameters (`rdma_conn_param` or `rdma_ud_param`).
#[derive(Clone, Default)]
pub(crate) enum Param {
    #[default]
    None,
    Conn {
        private: Vec<u8>,
        responder_resources: u8,
        initiator_depth: u8,
        flow_control: u8,
        retry_count: u8,
        rnr_retry_count: u8,
        srq: u8,
        qp_num: u32,
    },
    Ud {
        private: Vec<u8>,
        ah_attr: crate::abi::ibv_ah_attr,
        qp_num: u32,
        qkey: u32,
    },
    /// A multicast join: the group's address handle attributes (`dgid` its MGID), and the
    /// program's context for the join, which the event carries as `private_data`.
    Mcast {
        ah_attr: crate::abi::ibv_ah_attr,
        qkey: u32,
        context: usize,
        /// The QP is attached when the program reads the event (not a send-only join).
        attach: bool,
    },
}

/// An event channel; the C `struct rdma_event_channel` is its first field.
#[repr(C)]
pub(crate) struct Channel {
    pub c: rdma_event_channel,
    q: Mutex<VecDeque<Pending>>,
    /// Ids using this channel (`rdma_destroy_event_channel` refuses while any do).
    pub users: Mutex<usize>,
}

/// A channel pointer that may cross threads (the channel lives until destroyed, and is
/// only destroyed once no id uses it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ChanRef(pub *mut Channel);
// SAFETY: Channel is Sync (its state is behind mutexes) and outlives every ChanRef in use
// (destroy refuses while ids use it; ids hold the only other references).
unsafe impl Send for ChanRef {}
// SAFETY: as above.
unsafe impl Sync for ChanRef {}

impl ChanRef {
    pub fn get(&self) -> &Channel {
        // SAFETY: see the Send impl: the channel outlives its references.
        unsafe { &*self.0 }
    }
}

impl Channel {
    pub fn create() -> Result<ChanRef> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        let ch = Box::new(Channel {
            c: rdma_event_channel { fd },
            q: Mutex::new(VecDeque::new()),
            users: Mutex::new(0),
        });
        Ok(ChanRef(Box::into_raw(ch)))
    }

    /// Frees the channel.
    ///
    /// # Safety
    /// `ch` came from [`Channel::create`], no id uses it and no thread reads it.
    pub unsafe fn destroy(ch: ChanRef) {
        // SAFETY: contract.
        let b = unsafe { Box::from_raw(ch.0) };
        // SAFETY: our own fd.
        unsafe { libc::close(b.c.fd) };
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a u64 to our eventfd.
        unsafe { libc::write(self.c.fd, (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a u64; the counter is > 0 (the queue was not
        // empty under the lock), so this never blocks.
        unsafe { libc::read(self.c.fd, (&mut v as *mut u64).cast(), 8) };
    }

    pub fn push(&self, p: Pending) {
        let mut q = self.q.lock();
        q.push_back(p);
        if q.len() == 1 {
            self.signal();
        }
    }

    /// Removes the queued events `pred` selects (ids being destroyed or migrated).
    pub fn take(&self, mut pred: impl FnMut(&Pending) -> bool) -> Vec<Pending> {
        let mut q = self.q.lock();
        let was = !q.is_empty();
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(q.len());
        while let Some(p) = q.pop_front() {
            if pred(&p) {
                out.push(p);
            } else {
                keep.push_back(p);
            }
        }
        *q = keep;
        if was && q.is_empty() {
            self.drain();
        }
        out
    }

    /// The next event; blocks as the fd's `O_NONBLOCK` says. The owning id's delivered
    /// count is raised under the queue lock so that `rdma_destroy_id` cannot miss an event
    /// being handed out.
    pub fn next(&self) -> Result<Pending> {
        loop {
            {
                let mut q = self.q.lock();
                if let Some(p) = q.pop_front() {
                    if q.is_empty() {
                        self.drain();
                    }
                    let owner: &IdPriv = p.listen.as_ref().unwrap_or(&p.id).get();
                    owner.delivered();
                    return Ok(p);
                }
            }
            // SAFETY: fcntl on our own fd.
            let fl = unsafe { libc::fcntl(self.c.fd, libc::F_GETFL) };
            if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
                return Err(Error::Os {
                    what: "rdma_get_cm_event",
                    errno: libc::EAGAIN,
                });
            }
            let mut pfd = libc::pollfd {
                fd: self.c.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, -1) };
            if r < 0 {
                let e = Error::last_os("rdma_get_cm_event");
                if e.errno() == libc::EINTR {
                    return Err(e);
                }
            }
        }
    }
}
