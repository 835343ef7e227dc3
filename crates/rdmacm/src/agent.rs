//! The CM agent of one device: the GSI QP (QPN 1) from softhca's private verb, its CQs and
//! buffers, and the progress thread that feeds received MADs and timer expiries to the
//! `softhca_cm::Endpoint` (which lives in the global CM state, see `cma.rs`).
//!
//! There is no kernel: the connection manager runs in the process, one agent per device,
//! as the kernel runs one `ib_cm` agent per port.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use softhca_cm::mad::{GSI_QKEY, MAD_LEN};
use softhca_cm::Outgoing;

use crate::abi::*;
use crate::error::{Error, Result};
use crate::verbs::*;

/// Receive slots: the 40-byte GRH then the MAD.
const RECV_SLOTS: usize = 128;
const RECV_LEN: usize = 40 + MAD_LEN;
const SEND_SLOTS: usize = 128;

/// An opened device and its GSI resources; immutable once built.
pub(crate) struct Dev {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub node_guid: u64,
    pub active_mtu: u32,
    max_mtu: u32,
    pub max_resp_res: u8,
    pub max_init_depth: u8,
    /// (GID index, IP) of every RoCE v2 GID.
    pub gids: Vec<(u8, IpAddr)>,
    /// (GID index, path MTU code) of the GIDs whose netdev is known: the MTU its
    /// interface carries.
    gid_mtus: Vec<(u8, u8)>,
    qp: *mut ibv_qp,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    chan: *mut ibv_comp_channel,
    lkey: u32,
    buf: *mut u8,
    pub timerfd: c_int,
}

// SAFETY: the verbs objects are thread-safe (libibverbs' contract); the raw pointers are
// never freed (agents live as long as the process).
unsafe impl Send for Dev {}
// SAFETY: as above.
unsafe impl Sync for Dev {}

/// Mutable per-device state, under the global CM lock.
pub(crate) struct DevState {
    /// The source GID index of the MADs to each destination.
    sources: rustc_hash::FxHashMap<IpAddr, u8>,
    /// GSI address handles by destination and traffic class, with their source GID index.
    ahs: rustc_hash::FxHashMap<(IpAddr, u8), (usize, u8)>,
    free_send: Vec<usize>,
}

/// Monotonic nanoseconds for the endpoint's clock.
pub(crate) fn now() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let s = *START.get_or_init(Instant::now);
    s.elapsed().as_nanos() as u64 + 1
}

/// The kernel's route source for `dst` (what a connected UDP socket is given).
pub(crate) fn route_source(dst: IpAddr) -> Result<IpAddr> {
    let any: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let os = |e: std::io::Error| Error::Os {
        what: "route lookup",
        errno: e.raw_os_error().unwrap_or(libc::ENETUNREACH),
    };
    let s = UdpSocket::bind(any).map_err(os)?;
    s.connect((dst, 4791))
        .map_err(|e| Error::NoRoute(e.raw_os_error().unwrap_or(libc::ENETUNREACH)))?;
    Ok(s.local_addr().map_err(os)?.ip())
}

/// Whether `ip` is an address of this host.
pub(crate) fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || UdpSocket::bind((ip, 0)).is_ok()
}

pub(crate) fn ip_to_gid(ip: IpAddr) -> ibv_gid {
    ibv_gid {
        raw: softhca_cm::Gid::from_ip(ip).0,
    }
}

impl Dev {
    /// Which GID a connection to `dst` leaves from: the route's source if it is a GID; for
    /// a destination on this host (loopback or a local address) the device's loopback GID
    /// of the family, as softhca's verbs pick it (`Context::gid_index_for`). So too for a
    /// multicast group whose route leaves from an address another process serves: sent
    /// from a loopback address it reaches the host's other devices (`sync_mcast`).
    pub fn source_for(&self, dst: IpAddr) -> Result<(u8, IpAddr)> {
        let routed = route_source(dst)?;
        if let Some(g) = self.gids.iter().find(|g| g.1 == routed) {
            return Ok(*g);
        }
        let local = dst.is_loopback()
            || dst.is_multicast()
            || routed == dst
            || self.gids.iter().any(|g| g.1 == dst);
        if local {
            let fam = |ip: &IpAddr| ip.is_ipv4() == dst.is_ipv4();
            if let Some(g) = self
                .loopback_gid(dst.is_ipv4())
                .or_else(|| self.gids.iter().find(|g| fam(&g.1)).copied())
            {
                return Ok(g);
            }
        }
        Err(Error::NoDevice)
    }

    /// MADs to `dst` leave from `src` (a connection's own address, which need not be the
    /// route's source: a device with two addresses on one interface), as the kernel's
    /// CM sends from the cm_id's source GID.
    pub fn use_source(&self, st: &mut DevState, dst: IpAddr, src: IpAddr) {
        if let Some(sgid) = self.gid_index(src) {
            st.sources.insert(dst, sgid);
        }
    }

    /// The address handle for MADs to `dst` with traffic class `tc` (their IP TOS), from
    /// the destination's source GID; one whose source changed is made again.
    fn ah_for(&self, st: &mut DevState, dst: IpAddr, tc: u8) -> Result<*mut ibv_ah> {
        let sgid = match st.sources.get(&dst) {
            Some(&g) => g,
            None => {
                let (g, _) = self.source_for(dst)?;
                st.sources.insert(dst, g);
                g
            }
        };
        match st.ahs.get(&(dst, tc)) {
            Some(&(ah, g)) if g == sgid => return Ok(ah as *mut ibv_ah),
            Some(&(old, _)) => {
                st.ahs.remove(&(dst, tc));
                // SAFETY: our AH; every GSI send completes before `send` returns.
                unsafe { ibv_destroy_ah(old as *mut ibv_ah) };
            }
            None => {}
        }
        self.create_ah(st, dst, tc, sgid)
    }

    fn create_ah(&self, st: &mut DevState, dst: IpAddr, tc: u8, sgid: u8) -> Result<*mut ibv_ah> {
        let mut attr = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ip_to_gid(dst),
                flow_label: 0,
                sgid_index: sgid,
                hop_limit: 64,
                traffic_class: tc,
            },
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        // SAFETY: valid PD and attributes.
        let ah = unsafe { ibv_create_ah(self.pd, &mut attr) };
        if ah.is_null() {
            return Err(Error::last_os("ibv_create_ah (GSI)"));
        }
        st.ahs.insert((dst, tc), (ah as usize, sgid));
        Ok(ah)
    }

    /// The device's loopback GID of the family (IPv4 or IPv6), if it serves one.
    pub fn loopback_gid(&self, ipv4: bool) -> Option<(u8, IpAddr)> {
        self.gids
            .iter()
            .find(|g| g.1.is_loopback() && g.1.is_ipv4() == ipv4)
            .copied()
    }

    pub fn gid_index(&self, ip: IpAddr) -> Option<u8> {
        self.gids.iter().find(|g| g.1 == ip).map(|g| g.0)
    }

    /// The path MTU (`IBV_MTU_*`) of a RoCE route from `local`: what its netdev carries,
    /// as the kernel's `cma_resolve_iboe_route` takes `iboe_get_mtu(ndev->mtu)`; the
    /// port's active MTU when the netdev is not known; at most the port's largest. A
    /// device serving loopback and Ethernet then still offers 4096 between loopback
    /// addresses.
    pub fn path_mtu(&self, local: IpAddr) -> u8 {
        let gid = self.gid_index(local);
        self.gid_mtus
            .iter()
            .find(|m| Some(m.0) == gid)
            .map_or(self.active_mtu, |m| u32::from(m.1).min(self.max_mtu))
            .clamp(1, 5) as u8
    }

    /// Opens `dev` and builds its GSI QP; `create_gsi` is softhca's private verb.
    pub fn open(dev: *mut ibv_device, create_gsi: CreateGsiQp) -> Result<(Dev, DevState)> {
        // SAFETY: `dev` comes from ibv_get_device_list.
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(Error::last_os("ibv_open_device"));
        }
        // SAFETY: zeroed C struct filled by the call.
        let mut da: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out pointer.
        if unsafe { ibv_query_device(ctx, &mut da) } != 0 {
            return Err(Error::last_os("ibv_query_device"));
        }
        let mut pa = ibv_port_attr::default();
        // SAFETY: valid context and out pointer.
        if unsafe { softhca_rdmacm_query_port(ctx, 1, &mut pa) } != 0 {
            return Err(Error::last_os("ibv_query_port"));
        }
        let gids = query_gids(ctx, &pa);
        let gid_mtus = gids
            .iter()
            .filter_map(|&(i, _)| Some((i, netdev_mtu_code(ctx, i)?)))
            .collect();
        // SAFETY: valid context.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(Error::last_os("ibv_alloc_pd"));
        }
        let (chan, recv_cq, send_cq) = create_cqs(ctx)?;
        let qp = create_gsi_qp(pd, send_cq, recv_cq, create_gsi)?;
        let (buf, lkey) = register_slots(pd)?;
        // SAFETY: plain syscall.
        let timerfd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
        if timerfd < 0 {
            return Err(Error::last_os("timerfd_create"));
        }
        let d = Dev {
            ctx,
            pd,
            node_guid: u64::from_be(da.node_guid),
            active_mtu: pa.active_mtu,
            max_mtu: pa.max_mtu,
            max_resp_res: da.max_qp_rd_atom.clamp(0, 255) as u8,
            max_init_depth: da.max_qp_init_rd_atom.clamp(0, 255) as u8,
            gids,
            gid_mtus,
            qp,
            send_cq,
            recv_cq,
            chan,
            lkey,
            buf,
            timerfd,
        };
        for i in 0..RECV_SLOTS {
            d.post_recv(i)?;
        }
        // SAFETY: valid CQ.
        unsafe { softhca_rdmacm_req_notify_cq(recv_cq, 0) };
        let st = DevState {
            sources: Default::default(),
            ahs: Default::default(),
            free_send: (0..SEND_SLOTS).collect(),
        };
        Ok((d, st))
    }

    fn post_recv(&self, slot: usize) -> Result<()> {
        // SAFETY: the slot lies within our registered buffer.
        let r = unsafe {
            softhca_rdmacm_post_recv1(
                self.qp,
                slot as u64,
                self.buf.add(slot * RECV_LEN).cast(),
                RECV_LEN as u32,
                self.lkey,
            )
        };
        if r != 0 {
            return Err(Error::Os {
                what: "ibv_post_recv (GSI)",
                errno: r,
            });
        }
        Ok(())
    }

    /// Sends a MAD to QP 1 of `out.dst` with IP TOS `out.traffic_class`.
    pub fn send(&self, st: &mut DevState, out: &Outgoing) -> Result<()> {
        let (dst, mad) = (out.dst, &out.mad);
        let ah = self.ah_for(st, dst, out.traffic_class)?;
        let deadline = Instant::now() + Duration::from_secs(1);
        let slot = loop {
            self.reap_sends(st);
            if let Some(s) = st.free_send.pop() {
                break s;
            }
            if Instant::now() > deadline {
                return Err(Error::Os {
                    what: "GSI send queue full",
                    errno: libc::ENOBUFS,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        };
        // SAFETY: the send slot lies within our registered buffer and is not in flight.
        let p = unsafe { self.buf.add(RECV_SLOTS * RECV_LEN + slot * MAD_LEN) };
        // SAFETY: as above; MAD_LEN bytes.
        unsafe { std::ptr::copy_nonoverlapping(mad.as_ptr(), p, MAD_LEN) };
        // SAFETY: valid QP, AH and buffer.
        let r = unsafe {
            softhca_rdmacm_post_ud_send(
                self.qp,
                slot as u64,
                ah,
                1,
                GSI_QKEY,
                p.cast::<c_void>(),
                MAD_LEN as u32,
                self.lkey,
            )
        };
        if r != 0 {
            st.free_send.push(slot);
            return Err(Error::Os {
                what: "ibv_post_send (GSI)",
                errno: r,
            });
        }
        // Wait until the device has sent it: the kernel sends a MAD whatever the process
        // does next, and a program that exits right after rdma_destroy_id (qperf's server)
        // must still get its DREP out before the datapath thread dies with it.
        let deadline = Instant::now() + Duration::from_millis(200);
        while !st.free_send.contains(&slot) && Instant::now() < deadline {
            self.reap_sends(st);
            if !st.free_send.contains(&slot) {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    fn reap_sends(&self, st: &mut DevState) {
        let mut wc = [ibv_wc::default(); 16];
        loop {
            // SAFETY: valid CQ and array.
            let n =
                unsafe { softhca_rdmacm_poll_cq(self.send_cq, wc.len() as c_int, wc.as_mut_ptr()) };
            if n <= 0 {
                return;
            }
            for w in &wc[..n as usize] {
                st.free_send.push(w.wr_id as usize);
            }
        }
    }

    /// Arms the timer for the endpoint's next deadline (absolute, [`now`] clock).
    pub fn arm(&self, at: Option<u64>) {
        let mut its: libc::itimerspec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        if let Some(at) = at {
            let d = at.saturating_sub(now()).max(1);
            its.it_value.tv_sec = (d / 1_000_000_000) as libc::time_t;
            its.it_value.tv_nsec = (d % 1_000_000_000) as libc::c_long;
        }
        // SAFETY: our timerfd and a valid itimerspec.
        unsafe { libc::timerfd_settime(self.timerfd, 0, &its, std::ptr::null_mut()) };
    }

    /// Waits for MADs or the timer; returns the MADs received (source IP, IP TOS, MAD)
    /// and whether the timer fired.
    pub fn wait(&self) -> (Vec<(IpAddr, u8, [u8; MAD_LEN])>, bool) {
        // SAFETY: the channel pointer is valid.
        let chan_fd = unsafe { *(self.chan as *const c_int).add(2) };
        let mut fds = [
            libc::pollfd {
                fd: chan_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.timerfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        let mut mads = Vec::new();
        if r <= 0 {
            return (mads, false);
        }
        let mut fired = false;
        if fds[1].revents & libc::POLLIN != 0 {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes into a u64 from our timerfd.
            unsafe { libc::read(self.timerfd, (&mut v as *mut u64).cast(), 8) };
            fired = true;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid channel and out pointers; the fd is readable.
            if unsafe { ibv_get_cq_event(self.chan, &mut cq, &mut ctx) } == 0 {
                // SAFETY: the CQ the event was for.
                unsafe {
                    ibv_ack_cq_events(cq, 1);
                    softhca_rdmacm_req_notify_cq(self.recv_cq, 0);
                }
            }
        }
        let mut wc = [ibv_wc::default(); 16];
        loop {
            // SAFETY: valid CQ and array.
            let n =
                unsafe { softhca_rdmacm_poll_cq(self.recv_cq, wc.len() as c_int, wc.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            for w in &wc[..n as usize] {
                let slot = w.wr_id as usize;
                if slot >= RECV_SLOTS {
                    continue;
                }
                if w.status == IBV_WC_SUCCESS && w.byte_len as usize >= RECV_LEN {
                    // SAFETY: the slot is within our buffer and its receive completed.
                    let b = unsafe {
                        std::slice::from_raw_parts(self.buf.add(slot * RECV_LEN), RECV_LEN)
                    };
                    // The GRH: for an IPv4 peer its last 20 bytes are the IPv4 header
                    // (version nibble 4); otherwise the IPv6 source GID at bytes 8..24
                    // and the traffic class in bits 4..12.
                    let (src, tos) = if b[20] >> 4 == 4 {
                        (IpAddr::V4(Ipv4Addr::new(b[32], b[33], b[34], b[35])), b[21])
                    } else {
                        let mut g = [0u8; 16];
                        g.copy_from_slice(&b[8..24]);
                        (softhca_cm::Gid(g).to_ip(), (b[0] << 4) | (b[1] >> 4))
                    };
                    let mut mad = [0u8; MAD_LEN];
                    mad.copy_from_slice(&b[40..]);
                    mads.push((src, tos, mad));
                }
                let _ = self.post_recv(slot);
            }
        }
        (mads, fired)
    }
}

pub(crate) fn modify(qp: *mut ibv_qp, a: &mut ibv_qp_attr, mask: c_int) -> Result<()> {
    // SAFETY: valid QP (caller) and attributes.
    let r = unsafe { ibv_modify_qp(qp, a, mask) };
    if r != 0 {
        return Err(Error::Os {
            what: "ibv_modify_qp",
            errno: r,
        });
    }
    Ok(())
}

/// The port's non-empty GID entries, with their indices.
fn query_gids(ctx: *mut ibv_context, pa: &ibv_port_attr) -> Vec<(u8, IpAddr)> {
    let mut gids = Vec::new();
    for i in 0..pa.gid_tbl_len.clamp(0, 256) {
        let mut g = ibv_gid::default();
        // SAFETY: valid context and out pointer.
        if unsafe { ibv_query_gid(ctx, 1, i, &mut g) } != 0 || g.raw == [0; 16] {
            continue;
        }
        gids.push((i as u8, softhca_cm::Gid(g.raw).to_ip()));
    }
    gids
}

/// The path MTU code the netdev of GID `index` carries (`ndev_ifindex` of
/// `ibv_query_gid_ex`, its MTU from sysfs); None when not known.
fn netdev_mtu_code(ctx: *mut ibv_context, index: u8) -> Option<u8> {
    let mut e = ibv_gid_entry::default();
    let size = std::mem::size_of::<ibv_gid_entry>();
    // SAFETY: valid context and an out pointer of `size` bytes.
    if unsafe { _ibv_query_gid_ex(ctx, 1, index.into(), &mut e, 0, size) } != 0 {
        return None;
    }
    let mut name = [0 as std::ffi::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname writes at most.
    if e.ndev_ifindex == 0
        || unsafe { libc::if_indextoname(e.ndev_ifindex, name.as_mut_ptr()) }.is_null()
    {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_str()
        .ok()?;
    let mtu: usize = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(softhca_wire::ib_mtu_code_for_netdev(mtu))
}

/// The completion channel, the receive CQ that signals it and the unsignalled send CQ.
fn create_cqs(ctx: *mut ibv_context) -> Result<(*mut ibv_comp_channel, *mut ibv_cq, *mut ibv_cq)> {
    // SAFETY: valid context.
    let chan = unsafe { ibv_create_comp_channel(ctx) };
    if chan.is_null() {
        return Err(Error::last_os("ibv_create_comp_channel"));
    }
    // SAFETY: valid context and channel.
    let recv_cq =
        unsafe { ibv_create_cq(ctx, 2 * RECV_SLOTS as c_int, std::ptr::null_mut(), chan, 0) };
    let (no_context, no_channel) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid context.
    let send_cq = unsafe { ibv_create_cq(ctx, 2 * SEND_SLOTS as c_int, no_context, no_channel, 0) };
    if recv_cq.is_null() || send_cq.is_null() {
        return Err(Error::last_os("ibv_create_cq"));
    }
    Ok((chan, recv_cq, send_cq))
}

/// QP1 in RTS with the GSI Q_Key (IBTA 13.4.6.1), as the kernel's ib_mad sets it up.
fn create_gsi_qp(
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    create_gsi: CreateGsiQp,
) -> Result<*mut ibv_qp> {
    let mut init = ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq,
        recv_cq,
        srq: std::ptr::null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: SEND_SLOTS as u32,
            max_recv_wr: RECV_SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_UD,
        sq_sig_all: 0,
    };
    // SAFETY: valid PD and attributes.
    let qp = unsafe { create_gsi(pd, &mut init) };
    if qp.is_null() {
        return Err(Error::last_os("softhca_create_gsi_qp"));
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: 1,
        qkey: GSI_QKEY,
        ..Default::default()
    };
    modify(
        qp,
        &mut a,
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
    )?;
    a.qp_state = IBV_QPS_RTR;
    modify(qp, &mut a, IBV_QP_STATE)?;
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    modify(qp, &mut a, IBV_QP_STATE | IBV_QP_SQ_PSN)?;
    Ok(qp)
}

/// The receive and send slots, in one buffer registered for the life of the process.
fn register_slots(pd: *mut ibv_pd) -> Result<(*mut u8, u32)> {
    let len = RECV_SLOTS * RECV_LEN + SEND_SLOTS * MAD_LEN;
    let buf = Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
    // SAFETY: `buf` is `len` bytes we own for the life of the process.
    let mr = unsafe { ibv_reg_mr(pd, buf.cast(), len, IBV_ACCESS_LOCAL_WRITE as c_int) };
    if mr.is_null() {
        return Err(Error::last_os("ibv_reg_mr"));
    }
    // SAFETY: ibv_reg_mr returned a valid MR.
    Ok((buf, unsafe { (*mr).lkey }))
}
