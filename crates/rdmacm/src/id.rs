//! `struct rdma_cm_id` behind a private allocation, as librdmacm's `cma_id_private`.

use parking_lot::{Condvar, Mutex};

use crate::abi::{ibv_sa_path_rec, rdma_cm_id};

/// The C id is the first field, so `*mut rdma_cm_id` and `*mut IdPriv` convert by a cast.
#[repr(C)]
pub(crate) struct IdPriv {
    pub id: rdma_cm_id,
    /// `id->route.path_rec` points here (one path, as for RoCE).
    pub path: ibv_sa_path_rec,
    /// (events handed to the program, events acknowledged): `rdma_destroy_id` waits until
    /// they are equal, as librdmacm's `events_completed` / `events_reported`.
    acks: Mutex<(u64, u64)>,
    cv: Condvar,
}

impl IdPriv {
    pub fn new(id: rdma_cm_id) -> Box<IdPriv> {
        Box::new(IdPriv {
            id,
            path: ibv_sa_path_rec::default(),
            acks: Mutex::new((0, 0)),
            cv: Condvar::new(),
        })
    }

    pub fn delivered(&self) {
        self.acks.lock().0 += 1;
    }

    pub fn acked(&self) {
        let mut a = self.acks.lock();
        a.1 += 1;
        self.cv.notify_all();
    }

    pub fn wait_acked(&self) {
        let mut a = self.acks.lock();
        while a.1 < a.0 {
            self.cv.wait(&mut a);
        }
    }
}

/// An id pointer that may cross threads: ids are freed only by `rdma_destroy_id`, after
/// their queued events are removed and their delivered events acknowledged.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct IdRef(pub *mut IdPriv);
// SAFETY: IdPriv's shared state is behind mutexes; the C struct is written only under the
// global CM lock (or by its owning program), and the pointer stays valid (see above).
unsafe impl Send for IdRef {}
// SAFETY: as above.
unsafe impl Sync for IdRef {}

impl IdRef {
    pub fn get(&self) -> &IdPriv {
        // SAFETY: valid until rdma_destroy_id, which first removes every IdRef it can reach.
        unsafe { &*self.0 }
    }

    /// The C struct, for writing.
    pub fn c<'a>(self) -> &'a mut rdma_cm_id {
        // SAFETY: as `get`; writes happen under the global CM lock, as the kernel's
        // ucma updates an id under its own lock while the program may read it.
        unsafe { &mut (*self.0).id }
    }

    pub fn key(&self) -> usize {
        self.0 as usize
    }
}
