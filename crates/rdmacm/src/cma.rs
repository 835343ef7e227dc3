//! The connection manager state of the process: ids, ports, listeners, the devices' CM
//! agents and endpoints, under one lock; the rdma_cm operations; translation of endpoint
//! events into `rdma_cm_event`s on the right channel.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock};

use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashMap;
use softhca_cm::ip::{parse_service_id, service_id, CMA_HDR_LEN, RDMA_UDP_QKEY};
use softhca_cm::{
    AcceptParams, CmEvent, CmId, CmState, CmaHdr, ConnectParams, Endpoint, EndpointConfig,
    PortSpace, Psn, Qpn, RejReason, SidrReplyParams, SidrRequestParams, SidrStatus,
};

use crate::abi::*;
use crate::agent::{self, ip_to_gid, modify, Dev, DevState};
use crate::channel::{ChanRef, Channel, Param, Pending};
use crate::error::{Error, Result};
use crate::id::{IdPriv, IdRef};
use crate::verbs::*;

/// `CMA_IBOE_PACKET_LIFETIME` of Linux 6.1 (Debian 12's kernel).
const PACKET_LIFETIME: u8 = 18;
/// Hop limit of a routed RoCE v2 path (`cma_resolve_iboe_route` takes the route's: 64).
const HOP_LIMIT: u8 = 64;
/// The destination QPN of a multicast send (IBTA 10.5.2.4; the kernel's MULTICAST_JOIN
/// event gives it).
const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// How long a REQ or SIDR_REQ for a port nobody listens on waits for `rdma_listen`
/// before it is rejected (see `EndpointConfig::no_listener_grace`): perftest `-R`
/// connects right after its handshake, when its server is about to listen.
const NO_LISTENER_GRACE_NS: u64 = 1_000_000_000;

/// Per-id state (librdmacm's `cma_id_private` plus the kernel's `rdma_id_private`).
pub(crate) struct IdState {
    pub chan: ChanRef,
    pub sync: bool,
    pub ps: u16,
    pub dev: Option<usize>,
    /// Bound local address (the IP may be the wildcard).
    pub local: Option<SocketAddr>,
    pub port_held: bool,
    pub remote: Option<SocketAddr>,
    pub addr_resolved: bool,
    pub route_resolved: bool,
    pub listening: bool,
    pub cm: Option<CmId>,
    pub ud: bool,
    pub tos: u8,
    pub reuse: bool,
    pub ack_timeout: Option<u8>,
    pub sgid_index: u8,
    /// `rdma_id_private.seq_num`: the REQ's or the REP's starting PSN, and our receive PSN.
    pub psn: u32,
    pub resp_res: u8,
    pub init_depth: u8,
    pub qp_init_attr: Option<ibv_qp_init_attr>,
    pub connect_error: bool,
    pub disconnected: bool,
    /// The multicast groups joined (`struct cma_multicast`).
    pub mcs: Vec<McJoin>,
}

/// A multicast group an id joined.
pub(crate) struct McJoin {
    addr: SocketAddr,
    mgid: ibv_gid,
    send_only: bool,
}

struct DevEntry {
    dev: Arc<Dev>,
    st: DevState,
    ep: Endpoint,
    /// Listeners per service ID (the endpoint listens once per service ID).
    sids: FxHashMap<u64, usize>,
}

/// A bound (IP, reuseaddr, id) on one (port space, port).
type PortUse = (IpAddr, bool, usize);

pub(crate) struct Cma {
    devs: Vec<DevEntry>,
    opened: bool,
    pub ids: FxHashMap<usize, IdState>,
    /// (ps, port) → who holds it.
    ports: FxHashMap<(u16, u16), Vec<PortUse>>,
    /// (ps, port, IP, device or None for all, id).
    listeners: Vec<(u16, u16, IpAddr, usize)>,
    conns: FxHashMap<(usize, CmId), IdRef>,
}

// SAFETY: the raw pointers in the state are verbs objects (thread-safe by libibverbs'
// contract) and ids/channels whose lifetime the state itself manages.
unsafe impl Send for Cma {}

static CMA: LazyLock<Mutex<Cma>> = LazyLock::new(|| {
    Mutex::new(Cma {
        devs: Vec::new(),
        opened: false,
        ids: FxHashMap::default(),
        ports: FxHashMap::default(),
        listeners: Vec::new(),
        conns: FxHashMap::default(),
    })
});

pub(crate) fn lock() -> MutexGuard<'static, Cma> {
    CMA.lock()
}

fn rand24() -> u32 {
    rand::random::<u32>() & 0x00ff_ffff
}

impl Cma {
    /// Opens every device and starts its CM agent (once).
    fn open(&mut self) -> Result<()> {
        if self.opened {
            return Ok(());
        }
        let Some(create_gsi) = crate::verbs::create_gsi_qp_fn() else {
            eprintln!(
                "softhca-rdmacm: the libibverbs.so.1 loaded is not softhca's (no softhca_create_gsi_qp@SOFTHCA_PRIVATE_1): put softhca's libibverbs.so.1 next to this librdmacm.so.1 in LD_LIBRARY_PATH"
            );
            return Err(Error::NoDevice);
        };
        let mut n: c_int = 0;
        // SAFETY: out pointer valid.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(Error::last_os("ibv_get_device_list"));
        }
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` has `n` entries.
            let d = unsafe { *list.add(i) };
            let (dev, st) = match Dev::open(d, create_gsi) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("softhca-rdmacm: cannot start the CM agent of device {i}: {e}");
                    continue;
                }
            };
            let mut cfg = EndpointConfig::new(dev.node_guid, rand::random());
            cfg.no_listener_grace = NO_LISTENER_GRACE_NS;
            let ep = Endpoint::new(cfg);
            let dev = Arc::new(dev);
            let idx = self.devs.len();
            self.devs.push(DevEntry {
                dev: dev.clone(),
                st,
                ep,
                sids: FxHashMap::default(),
            });
            std::thread::Builder::new()
                .name("softhca-cm".into())
                .spawn(move || progress(idx, dev))
                .map_err(|_| Error::Os {
                    what: "spawn CM thread",
                    errno: libc::EAGAIN,
                })?;
        }
        self.opened = true;
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(at_exit) };
        Ok(())
    }

    /// Where a connection to `dst` goes (decided at `rdma_connect`, when the server has
    /// had its chance to listen): to another process's wildcard listener when `dst` is
    /// an address of this process's own devices and nothing here listens on its port
    /// (see `local_listeners`); else `dst` itself.
    fn local_destination(&self, ps: u16, dst: SocketAddr) -> SocketAddr {
        if !self.ours_unlistened(ps, dst) {
            return dst;
        }
        match crate::local_listeners::find(ps, dst.port(), dst.ip()) {
            Some(ip) => {
                crate::error::debug(format_args!(
                    "{dst} is ours with no listener here: to {ip}, another process's"
                ));
                SocketAddr::new(ip, dst.port())
            }
            None => dst,
        }
    }

    /// Whether `dst` is an address of this process's own devices with nothing here
    /// listening on its port: a connection there is for another process's listener.
    fn ours_unlistened(&self, ps: u16, dst: SocketAddr) -> bool {
        self.dev_of_ip(dst.ip()).is_some() && self.find_listener(ps, dst.port(), dst.ip()).is_none()
    }

    fn dev_of_ip(&self, ip: IpAddr) -> Option<usize> {
        self.devs.iter().position(|d| d.dev.gid_index(ip).is_some())
    }

    /// Sends what the endpoint queued, turns its events into rdma_cm events, rearms the
    /// timer.
    fn pump(&mut self, d: usize) {
        loop {
            let mut did = false;
            {
                let e = &mut self.devs[d];
                while let Some(out) = e.ep.poll_transmit() {
                    did = true;
                    if let Err(err) = e.dev.send(&mut e.st, &out) {
                        crate::error::debug(format_args!("send to {}: {err}", out.dst));
                    }
                }
            }
            while let Some(ev) = self.devs[d].ep.poll_event() {
                did = true;
                self.dispatch(d, ev);
            }
            if !did {
                break;
            }
        }
        let e = &self.devs[d];
        e.dev.arm(e.ep.poll_timeout());
    }

    fn push(&mut self, chan: ChanRef, p: Pending) {
        chan.get().push(p);
    }

    fn dispatch(&mut self, d: usize, ev: CmEvent) {
        let now = agent::now();
        match ev {
            CmEvent::ReqReceived { .. } => self.on_req_received(d, now, ev),
            CmEvent::SidrReqReceived { .. } => self.on_sidr_req_received(d, now, ev),
            other => self.on_connection_event(d, other),
        }
    }

    /// A REQ for a listener: a new id and a CONNECT_REQUEST event, or a reject.
    fn on_req_received(&mut self, d: usize, now: u64, ev: CmEvent) {
        let CmEvent::ReqReceived { id, peer, req } = ev else {
            return;
        };
        let hdr = match CmaHdr::parse(&req.private_data) {
            Ok(h) if h.version == 0 => h,
            _ => {
                let _ = self.devs[d]
                    .ep
                    .reject(now, id, RejReason::ConsumerDefined, &[]);
                return;
            }
        };
        let remote_gid = req.primary.remote_gid.to_ip();
        if self.devs[d].dev.gid_index(remote_gid).is_none() {
            // cm_req_handler: the primary remote GID must be one of ours.
            let _ = self.devs[d].ep.reject(now, id, RejReason::InvalidGid, &[]);
            return;
        }
        {
            let e = &mut self.devs[d];
            e.dev.use_source(&mut e.st, peer, remote_gid);
        }
        let Some((ps, port)) = parse_service_id(req.service_id) else {
            let _ = self.devs[d]
                .ep
                .reject(now, id, RejReason::InvalidServiceId, &[]);
            return;
        };
        let Some(listener) = self.find_listener(ps as u16, port, hdr.dst) else {
            // A listener on the service ID but not this IP: the kernel's
            // cma_ib_req_handler fails and ib_cm rejects "consumer defined".
            let _ = self.devs[d]
                .ep
                .reject(now, id, RejReason::ConsumerDefined, &[]);
            return;
        };
        let param = Param::Conn {
            private: req.private_data[CMA_HDR_LEN..].to_vec(),
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            flow_control: u8::from(req.end_to_end_flow_control),
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: u8::from(req.srq),
            qp_num: req.local_qpn.value(),
        };
        let local = SocketAddr::new(hdr.dst, port);
        let remote = SocketAddr::new(hdr.src, hdr.src_port);
        let Ok(child) = self.new_child(listener, d, local, remote, id) else {
            let _ = self.devs[d].ep.reject(now, id, RejReason::NoResources, &[]);
            return;
        };
        {
            let path = &mut child.get_mut().path;
            path.mtu = req.path_mtu;
            path.traffic_class = req.primary.traffic_class;
            path.hop_limit = req.primary.hop_limit;
            path.flow_label = req.primary.flow_label.to_be();
            path.packet_life_time = req.primary.local_ack_timeout.saturating_sub(1);
        }
        if let Some(s) = self.ids.get_mut(&child.key()) {
            s.resp_res = req.initiator_depth;
            s.init_depth = req.responder_resources;
            s.tos = req.primary.traffic_class;
        }
        self.connect_request(listener, child, param);
    }

    /// CONNECT_REQUEST for the new id `child`, on its listener's channel.
    fn connect_request(&mut self, listener: IdRef, child: IdRef, param: Param) {
        let chan = self.ids[&listener.key()].chan;
        let event = Pending {
            id: child,
            listen: Some(listener),
            event: RDMA_CM_EVENT_CONNECT_REQUEST,
            status: 0,
            param,
            rep: false,
        };
        self.push(chan, event);
    }

    /// A SIDR_REQ for a UD listener: a new id and a CONNECT_REQUEST event, or a reject.
    fn on_sidr_req_received(&mut self, d: usize, now: u64, ev: CmEvent) {
        let CmEvent::SidrReqReceived { id, peer, req } = ev else {
            return;
        };
        let reply_fail = |c: &mut Cma, st| {
            crate::error::debug(format_args!(
                "SIDR_REQ from {peer} for service ID {:#x}: {st:?}",
                req.service_id
            ));
            let p = SidrReplyParams {
                status: st,
                qpn: Qpn::new(0),
                qkey: 0,
                private_data: Vec::new(),
            };
            let _ = c.devs[d].ep.sidr_reply(now, id, &p);
        };
        let Ok(hdr) = CmaHdr::parse(&req.private_data) else {
            return reply_fail(self, SidrStatus::Reject);
        };
        let Some((ps, port)) = parse_service_id(req.service_id) else {
            return reply_fail(self, SidrStatus::Unsupported);
        };
        let Some(listener) = self.find_listener(ps as u16, port, hdr.dst) else {
            return reply_fail(self, SidrStatus::Unsupported);
        };
        let local = SocketAddr::new(hdr.dst, port);
        let remote = SocketAddr::new(hdr.src, hdr.src_port);
        let Ok(child) = self.new_child(listener, d, local, remote, id) else {
            return reply_fail(self, SidrStatus::NoQp);
        };
        let ah_attr = self.ud_ah(child, peer);
        let param = Param::Ud {
            private: req.private_data[CMA_HDR_LEN..].to_vec(),
            ah_attr,
            qp_num: 0,
            qkey: 0,
        };
        self.connect_request(listener, child, param);
    }

    /// Every other endpoint event, on an id that exists: the rdma_cm event it means.
    fn on_connection_event(&mut self, d: usize, other: CmEvent) {
        let cid = other.id();
        let Some(&idr) = self.conns.get(&(d, cid)) else {
            return;
        };
        let Some(st) = self.ids.get_mut(&idr.key()) else {
            return;
        };
        let chan = st.chan;
        let ev = |event: c_int, status: c_int, param: Param, rep: bool| Pending {
            id: idr,
            listen: None,
            event,
            status,
            param,
            rep,
        };
        let p = match other {
            CmEvent::RepReceived { rep, .. } => ev(
                RDMA_CM_EVENT_CONNECT_RESPONSE,
                0,
                Param::Conn {
                    private: rep.private_data.to_vec(),
                    responder_resources: rep.initiator_depth,
                    initiator_depth: rep.responder_resources,
                    flow_control: u8::from(rep.end_to_end_flow_control),
                    retry_count: 0,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: u8::from(rep.srq),
                    qp_num: rep.local_qpn.value(),
                },
                true,
            ),
            CmEvent::Established { .. } => ev(RDMA_CM_EVENT_ESTABLISHED, 0, Param::None, false),
            CmEvent::Rejected { rej, .. } => {
                self.conns.remove(&(d, cid));
                if let Some(s) = self.ids.get_mut(&idr.key()) {
                    s.cm = None;
                }
                ev(
                    RDMA_CM_EVENT_REJECTED,
                    c_int::from(rej.reason.to_u16()),
                    Param::Conn {
                        private: rej.private_data.to_vec(),
                        responder_resources: 0,
                        initiator_depth: 0,
                        flow_control: 0,
                        retry_count: 0,
                        rnr_retry_count: 0,
                        srq: 0,
                        qp_num: 0,
                    },
                    false,
                )
            }
            CmEvent::MraReceived { .. } => return,
            CmEvent::DreqReceived { .. } | CmEvent::DrepReceived { .. } => {
                // cma_ib_handler reports one DISCONNECTED per connection, on the
                // first of DREQ received / DREP received / DREQ timeout.
                if st.disconnected {
                    return;
                }
                st.disconnected = true;
                ev(RDMA_CM_EVENT_DISCONNECTED, 0, Param::None, false)
            }
            CmEvent::TimewaitExit { .. } => {
                self.forget_connection(d, cid, idr);
                ev(RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, Param::None, false)
            }
            CmEvent::Timeout { state, .. } => {
                if state == CmState::DreqSent {
                    if st.disconnected {
                        return;
                    }
                    st.disconnected = true;
                    ev(
                        RDMA_CM_EVENT_DISCONNECTED,
                        -libc::ETIMEDOUT,
                        Param::None,
                        false,
                    )
                } else {
                    self.forget_connection(d, cid, idr);
                    ev(
                        RDMA_CM_EVENT_UNREACHABLE,
                        -libc::ETIMEDOUT,
                        Param::None,
                        false,
                    )
                }
            }
            CmEvent::SidrRepReceived { rep, .. } => {
                let peer = st.remote.map(|r| r.ip());
                self.forget_connection(d, cid, idr);
                self.sidr_reply_event(idr, peer, &rep)
            }
            CmEvent::ReqReceived { .. } | CmEvent::SidrReqReceived { .. } => return,
        };
        self.push(chan, p);
    }

    /// The id's CM connection is over (timewait ended, timed out, or SIDR answered):
    /// the endpoint's ID no longer names it.
    fn forget_connection(&mut self, d: usize, cid: CmId, idr: IdRef) {
        self.conns.remove(&(d, cid));
        if let Some(s) = self.ids.get_mut(&idr.key()) {
            s.cm = None;
        }
    }

    /// The event a SIDR_REP means for a UD id: ESTABLISHED with the peer's QPN, Q_Key and
    /// address handle, or UNREACHABLE with the SIDR status (librdmacm `ucma_process_ud`).
    fn sidr_reply_event(
        &self,
        idr: IdRef,
        peer: Option<IpAddr>,
        rep: &softhca_cm::mad::SidrRep,
    ) -> Pending {
        if rep.status == SidrStatus::Success {
            let ah_attr = match peer {
                Some(p) => self.ud_ah(idr, p),
                None => ibv_ah_attr::default(),
            };
            Pending {
                id: idr,
                listen: None,
                event: RDMA_CM_EVENT_ESTABLISHED,
                status: 0,
                param: Param::Ud {
                    private: rep.private_data.to_vec(),
                    ah_attr,
                    qp_num: rep.qpn.value(),
                    qkey: rep.qkey,
                },
                rep: false,
            }
        } else {
            Pending {
                id: idr,
                listen: None,
                event: RDMA_CM_EVENT_UNREACHABLE,
                status: c_int::from(rep.status.to_u8()),
                param: Param::None,
                rep: false,
            }
        }
    }

    /// The address handle attributes of a UD peer, as the kernel's
    /// `cma_set_ud_event`/`ib_init_ah_from_path` give them for RoCE.
    fn ud_ah(&self, idr: IdRef, peer: IpAddr) -> ibv_ah_attr {
        ah_to(&self.ids[&idr.key()], peer)
    }

    fn find_listener(&self, ps: u16, port: u16, dst: IpAddr) -> Option<IdRef> {
        let m = |exact: bool| {
            self.listeners
                .iter()
                .find(|l| {
                    l.0 == ps
                        && l.1 == port
                        && if exact {
                            l.2 == dst
                        } else {
                            l.2.is_unspecified() && l.2.is_ipv4() == dst.is_ipv4()
                                || l.2.is_unspecified() && l.2.is_ipv6()
                        }
                })
                .map(|l| IdRef(l.3 as *mut IdPriv))
        };
        m(true).or_else(|| m(false))
    }

    /// The id a CONNECT_REQUEST reports (`ucma_process_conn_req`): the listener's channel
    /// (or, for a synchronous listener, a channel of its own), context, port space.
    fn new_child(
        &mut self,
        listener: IdRef,
        d: usize,
        local: SocketAddr,
        remote: SocketAddr,
        cm: CmId,
    ) -> Result<IdRef> {
        let ls = &self.ids[&listener.key()];
        let (lsync, lchan, ps, tos, reuse) = (ls.sync, ls.chan, ls.ps, ls.tos, ls.reuse);
        let lc = listener.c();
        let chan = if lsync { Channel::create()? } else { lchan };
        let idr = alloc_id(chan, lc.context, ps, lc.qp_type);
        let dev = self.devs[d].dev.clone();
        let sgid = dev.gid_index(local.ip()).unwrap_or(0);
        let mut st = new_state(chan, lsync, ps, lc.qp_type == IBV_QPT_UD);
        st.dev = Some(d);
        st.local = Some(local);
        st.remote = Some(remote);
        st.addr_resolved = true;
        st.route_resolved = true;
        st.cm = Some(cm);
        st.sgid_index = sgid;
        st.tos = tos;
        st.reuse = reuse;
        fill_addr(idr, &dev, Some(local), Some(remote));
        fill_path(idr, &dev, &st);
        self.ids.insert(idr.key(), st);
        self.conns.insert((d, cm), idr);
        Ok(idr)
    }

    fn state(&mut self, idr: IdRef) -> Result<&mut IdState> {
        self.ids
            .get_mut(&idr.key())
            .ok_or(Error::Invalid("unknown rdma_cm_id"))
    }

    fn reserve_port(
        &mut self,
        idr: IdRef,
        ps: u16,
        ip: IpAddr,
        port: u16,
        reuse: bool,
    ) -> Result<u16> {
        let free = |c: &Cma, port: u16| {
            c.ports.get(&(ps, port)).is_none_or(|v| {
                v.iter().all(|&(eip, er, eid)| {
                    let overlap = eip == ip || eip.is_unspecified() || ip.is_unspecified();
                    let elisten = c.ids.get(&eid).is_some_and(|s| s.listening);
                    !overlap || (reuse && er && !elisten)
                })
            })
        };
        let port = if port != 0 {
            if !free(self, port) {
                return Err(Error::AddrInUse);
            }
            port
        } else {
            // The kernel's ephemeral range (ip_local_port_range defaults).
            let (lo, hi) = (32768u32, 60999u32);
            let start = lo + rand::random::<u32>() % (hi - lo + 1);
            let mut found = None;
            for k in 0..=(hi - lo) {
                let p = (lo + (start - lo + k) % (hi - lo + 1)) as u16;
                if free(self, p) {
                    found = Some(p);
                    break;
                }
            }
            found.ok_or(Error::AddrInUse)?
        };
        self.ports
            .entry((ps, port))
            .or_default()
            .push((ip, reuse, idr.key()));
        Ok(port)
    }

    fn release_port(&mut self, idr: IdRef) {
        for v in self.ports.values_mut() {
            v.retain(|e| e.2 != idr.key());
        }
        self.ports.retain(|_, v| !v.is_empty());
    }

    /// Binds `idr` to `addr` (`rdma_bind_addr`, and the implicit binds of resolve/listen).
    fn bind(&mut self, idr: IdRef, addr: SocketAddr) -> Result<()> {
        let ip = addr.ip();
        // cma_any_addr: a loopback address binds like the wildcard, to no device (id->verbs
        // stays NULL; listening covers every device and matches the address exactly).
        // libfabric's verbs provider relies on it: a NULL verbs after binding "localhost"
        // makes it take its source address from the interfaces instead.
        let dev = if ip.is_unspecified() || ip.is_loopback() {
            None
        } else {
            self.open()?;
            match self.dev_of_ip(ip) {
                Some(d) => Some(d),
                // cma_translate_addr/cma_acquire_dev_by_src_ip: an address of this host
                // that no RDMA device has gives ENODEV, any other EADDRNOTAVAIL.
                None if agent::is_local(ip) => return Err(Error::NoDevice),
                None => return Err(Error::AddrNotAvail),
            }
        };
        let st = self.state(idr)?;
        if st.local.is_some() {
            return Err(Error::Invalid("rdma_cm_id already bound"));
        }
        let (ps, reuse) = (st.ps, st.reuse);
        let port = self.reserve_port(idr, ps, ip, addr.port(), reuse)?;
        let local = SocketAddr::new(ip, port);
        let st = self.state(idr)?;
        st.local = Some(local);
        st.port_held = true;
        st.dev = dev;
        let sgid = dev
            .and_then(|d| self.devs[d].dev.gid_index(ip))
            .unwrap_or(0);
        if let Some(s) = self.ids.get_mut(&idr.key()) {
            s.sgid_index = sgid;
        }
        match dev {
            Some(d) => {
                let dv = self.devs[d].dev.clone();
                fill_addr(idr, &dv, Some(local), None);
            }
            None => write_sockaddr(&mut idr.c().route.addr.src_storage, local),
        }
        Ok(())
    }
}

/// A new id with its private allocation.
/// The address handle attributes from an id's source GID to `dst` (a UD peer or a
/// multicast group), as the kernel's `ib_init_ah_from_path` / `ib_init_ah_from_mcmember`
/// give them for RoCE: global, hop limit 64, the id's TOS as traffic class.
fn ah_to(st: &IdState, dst: IpAddr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ip_to_gid(dst),
            flow_label: 0,
            sgid_index: st.sgid_index,
            hop_limit: HOP_LIMIT,
            traffic_class: st.tos,
        },
        is_global: 1,
        port_num: 1,
        ..Default::default()
    }
}

fn alloc_id(chan: ChanRef, context: *mut c_void, ps: u16, qp_type: u32) -> IdRef {
    // SAFETY: rdma_cm_id is plain C data; all-zero is its initial state (librdmacm
    // callocs it).
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = chan.0.cast();
    c.context = context;
    c.ps = c_int::from(ps);
    c.qp_type = qp_type;
    let b = IdPriv::new(c);
    *chan.get().users.lock() += 1;
    IdRef(Box::into_raw(b))
}

fn new_state(chan: ChanRef, sync: bool, ps: u16, ud: bool) -> IdState {
    IdState {
        chan,
        sync,
        ps,
        dev: None,
        local: None,
        port_held: false,
        remote: None,
        addr_resolved: false,
        route_resolved: false,
        listening: false,
        cm: None,
        ud,
        tos: 0,
        reuse: false,
        ack_timeout: None,
        sgid_index: 0,
        psn: rand24(),
        resp_res: 0,
        init_depth: 0,
        qp_init_attr: None,
        connect_error: false,
        disconnected: false,
        mcs: Vec::new(),
    }
}

pub(crate) fn write_sockaddr(ss: &mut libc::sockaddr_storage, a: SocketAddr) {
    // SAFETY: sockaddr_storage is plain data.
    *ss = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let s =
                unsafe { &mut *(ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            s.sin_family = libc::AF_INET as u16;
            s.sin_port = v.port().to_be();
            s.sin_addr.s_addr = u32::from_ne_bytes(v.ip().octets());
        }
        SocketAddr::V6(v) => {
            // SAFETY: as above, for sockaddr_in6.
            let s =
                unsafe { &mut *(ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as u16;
            s.sin6_port = v.port().to_be();
            s.sin6_addr.s6_addr = v.ip().octets();
            s.sin6_scope_id = v.scope_id();
        }
    }
}

/// A C `sockaddr` as a `SocketAddr` (AF_INET or AF_INET6).
///
/// # Safety
/// A non-null `sa` must point to a sockaddr of its family's size.
pub(crate) unsafe fn read_sockaddr(sa: *const libc::sockaddr) -> Result<SocketAddr> {
    if sa.is_null() {
        return Err(Error::Invalid("NULL address"));
    }
    // SAFETY: contract.
    match c_int::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: contract: an AF_INET sockaddr is a sockaddr_in.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Ok(SocketAddr::new(
                IpAddr::V4(s.sin_addr.s_addr.to_ne_bytes().into()),
                u16::from_be(s.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: contract: an AF_INET6 sockaddr is a sockaddr_in6.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Ok(SocketAddr::new(
                IpAddr::V6(s.sin6_addr.s6_addr.into()),
                u16::from_be(s.sin6_port),
            ))
        }
        _ => Err(Error::Invalid("address family (only AF_INET and AF_INET6)")),
    }
}

fn fill_addr(idr: IdRef, dev: &Dev, local: Option<SocketAddr>, remote: Option<SocketAddr>) {
    let c = idr.c();
    c.verbs = dev.ctx;
    c.pd = dev.pd;
    c.port_num = 1;
    if let Some(l) = local {
        write_sockaddr(&mut c.route.addr.src_storage, l);
        c.route.addr.ibaddr.sgid = ip_to_gid(l.ip());
    }
    if let Some(r) = remote {
        write_sockaddr(&mut c.route.addr.dst_storage, r);
        c.route.addr.ibaddr.dgid = ip_to_gid(r.ip());
    }
    c.route.addr.ibaddr.pkey = 0xffffu16.to_be();
}

/// The path record of a RoCE route (`cma_resolve_iboe_route`).
fn fill_path(idr: IdRef, dev: &Dev, st: &IdState) {
    let p = &mut idr.get_mut().path;
    if let Some(l) = st.local {
        p.sgid = ip_to_gid(l.ip());
    }
    if let Some(r) = st.remote {
        p.dgid = ip_to_gid(r.ip());
    }
    p.reversible = 1;
    p.numb_path = 1;
    p.pkey = 0xffffu16.to_be();
    p.hop_limit = HOP_LIMIT;
    p.traffic_class = st.tos;
    p.sl = 0;
    p.mtu_selector = 2;
    p.mtu = st
        .local
        .map_or(dev.active_mtu as u8, |l| dev.path_mtu(l.ip()));
    p.rate_selector = 2;
    p.rate = 0;
    p.packet_life_time_selector = 2;
    p.packet_life_time = st
        .ack_timeout
        .map_or(PACKET_LIFETIME, |t| t.saturating_sub(1));
    let c = idr.c();
    c.route.path_rec = p;
    c.route.num_paths = 1;
}

impl IdRef {
    fn get_mut<'a>(self) -> &'a mut IdPriv {
        // SAFETY: as IdRef::c; written under the global lock.
        unsafe { &mut *self.0 }
    }
}

/// At exit, the connections go as the kernel's `ucma_close` takes them when the process
/// closes its rdma_cm file: DREP for a received DREQ, DREQ for an established connection,
/// REJ for one being set up (qperf's server exits right after its DISCONNECTED event).
extern "C" fn at_exit() {
    let Some(mut c) = CMA.try_lock_for(std::time::Duration::from_millis(500)) else {
        return;
    };
    let now = agent::now();
    let conns: Vec<(usize, CmId)> = c.conns.keys().copied().collect();
    for (d, cm) in conns {
        c.devs[d].ep.destroy(now, cm);
    }
    for d in 0..c.devs.len() {
        c.pump(d);
    }
}

/// The progress thread of device `d`.
fn progress(d: usize, dev: Arc<Dev>) {
    loop {
        let (mads, fired) = dev.wait();
        if mads.is_empty() && !fired {
            continue;
        }
        let mut c = lock();
        let now = agent::now();
        for (src, tos, mad) in &mads {
            c.devs[d].ep.handle_mad(now, *src, *tos, mad);
        }
        if fired || c.devs[d].ep.poll_timeout().is_some_and(|t| t <= now) {
            c.devs[d].ep.handle_timeout(now);
        }
        c.pump(d);
    }
}

// ------------------------------------------------------------------ operations

pub(crate) fn create_id(
    chan: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
) -> Result<IdRef> {
    let ps16 = u16::try_from(ps)
        .ok()
        .and_then(PortSpace::from_u16)
        .ok_or(Error::Invalid("port space"))?;
    // rdma_create_id: UD for the UDP and IPoIB port spaces, RC otherwise.
    let ud = matches!(ps16, PortSpace::Udp | PortSpace::Ipoib);
    let (chan, sync) = if chan.is_null() {
        (Channel::create()?, true)
    } else {
        (ChanRef(chan.cast()), false)
    };
    let idr = alloc_id(
        chan,
        context,
        ps16 as u16,
        if ud { IBV_QPT_UD } else { IBV_QPT_RC },
    );
    let mut c = lock();
    // The kernel's CM answers on every device from boot; ours starts with the first id,
    // not at the first bind to a device address or listen: a program may tell its peer
    // its port before it listens (Debian's qperf does), and a REQ must then find the
    // device up, not a closed UDP port. A failure is reported by the call that needs it.
    let _ = c.open();
    c.ids
        .insert(idr.key(), new_state(chan, sync, ps16 as u16, ud));
    Ok(idr)
}

pub(crate) fn bind_addr(idr: IdRef, addr: SocketAddr) -> Result<()> {
    lock().bind(idr, addr)
}

/// Waits for the event of a synchronous id (librdmacm's `ucma_complete`).
pub(crate) fn complete(idr: IdRef) -> Result<()> {
    let (sync, chan) = {
        let c = lock();
        let st = c
            .ids
            .get(&idr.key())
            .ok_or(Error::Invalid("unknown rdma_cm_id"))?;
        (st.sync, st.chan)
    };
    if !sync {
        return Ok(());
    }
    let cid = idr.c();
    if !cid.event.is_null() {
        ack_event(cid.event);
        cid.event = std::ptr::null_mut();
    }
    let ev = get_event(chan)?;
    cid.event = ev;
    // SAFETY: get_event returned a valid event.
    let e = unsafe { &*ev };
    if e.status != 0 {
        if e.event == RDMA_CM_EVENT_REJECTED {
            return Err(Error::ConnRefused);
        }
        return Err(Error::Status(e.status));
    }
    Ok(())
}

pub(crate) fn resolve_addr(idr: IdRef, src: Option<SocketAddr>, dst: SocketAddr) -> Result<()> {
    {
        let mut c = lock();
        c.open()?;
        if let Some(s) = src {
            if c.state(idr)?.local.is_none() {
                c.bind(idr, s)?;
            }
        }
        write_sockaddr(&mut idr.c().route.addr.dst_storage, dst);
        let st = c.state(idr)?;
        let bound = st.local;
        let chan = st.chan;
        // The source: the bound address, else the route's source; it must be a GID.
        let res: Result<(usize, u8, IpAddr)> = (|| {
            if let Some(l) = bound.filter(|l| !l.ip().is_unspecified()) {
                let d = c.dev_of_ip(l.ip()).ok_or(Error::NoDevice)?;
                let g = c.devs[d].dev.gid_index(l.ip()).unwrap_or(0);
                return Ok((d, g, l.ip()));
            }
            let mut last = Error::NoDevice;
            for (d, e) in c.devs.iter().enumerate() {
                match e.dev.source_for(dst.ip()) {
                    Ok((g, ip)) => return Ok((d, g, ip)),
                    Err(err) => last = err,
                }
            }
            Err(last)
        })();
        let status = match res {
            Ok((d, g, ip)) => {
                let port = match bound {
                    Some(l) => l.port(),
                    None => {
                        let (ps, reuse) = (c.ids[&idr.key()].ps, c.ids[&idr.key()].reuse);
                        let p = c.reserve_port(idr, ps, ip, 0, reuse)?;
                        c.state(idr)?.port_held = true;
                        p
                    }
                };
                let local = SocketAddr::new(ip, port);
                let dev = c.devs[d].dev.clone();
                let st = c.state(idr)?;
                st.local = Some(local);
                st.remote = Some(dst);
                st.dev = Some(d);
                st.sgid_index = g;
                st.addr_resolved = true;
                fill_addr(idr, &dev, Some(local), Some(dst));
                0
            }
            // rdma_resolve_ip: a failed route lookup fails the call itself, with no
            // event; a route from an interface that is no RDMA device is an ADDR_ERROR
            // (cma addr_handler, cma_acquire_dev_by_src_ip).
            Err(e @ Error::NoRoute(_)) => return Err(e),
            Err(e) => -e.errno(),
        };
        let event = if status == 0 {
            RDMA_CM_EVENT_ADDR_RESOLVED
        } else {
            RDMA_CM_EVENT_ADDR_ERROR
        };
        c.push(
            chan,
            Pending {
                id: idr,
                listen: None,
                event,
                status,
                param: Param::None,
                rep: false,
            },
        );
    }
    complete(idr)
}

/// `rdma_join_multicast_ex` on RoCE (the kernel's `cma_iboe_join_multicast`; no SA):
/// the group's MGID is its address (IPv4-mapped for IPv4, as the kernel makes it for
/// RoCEv2), its Q_Key `RDMA_UDP_QKEY`; the MULTICAST_JOIN event carries the address
/// handle attributes to send to it (QPN 0xFFFFFF), and reading it attaches the id's QP
/// (librdmacm's `ucma_process_join`) unless the join is send-only.
pub(crate) fn join_multicast(
    idr: IdRef,
    addr: SocketAddr,
    send_only: bool,
    context: *mut c_void,
) -> Result<()> {
    {
        let mut c = lock();
        let st = c.state(idr)?;
        // rdma_join_multicast: an id with a device whose address is bound or resolved,
        // nothing more (a loopback bind names no device until it resolves).
        let idle = st.local.is_none() || st.dev.is_none();
        if idle || st.listening || st.route_resolved || st.cm.is_some() {
            return Err(Error::Invalid("join needs a bound or resolved id"));
        }
        if addr.ip().is_unspecified() {
            return Err(Error::Invalid("zero multicast address"));
        }
        // cma_iboe_join_multicast: RoCEv2 groups are IPv4 (ENOTSUPP for AF_INET6).
        if addr.is_ipv6() {
            return Err(Error::NotSupported("IPv6 multicast groups on RoCEv2"));
        }
        let ah_attr = ah_to(st, addr.ip());
        let mgid = ah_attr.grh.dgid;
        st.mcs.retain(|m| m.addr != addr);
        st.mcs.push(McJoin {
            addr,
            mgid,
            send_only,
        });
        let chan = st.chan;
        c.push(
            chan,
            Pending {
                id: idr,
                listen: None,
                event: RDMA_CM_EVENT_MULTICAST_JOIN,
                status: 0,
                param: Param::Mcast {
                    ah_attr,
                    qkey: RDMA_UDP_QKEY,
                    context: context as usize,
                    attach: !send_only,
                },
                rep: false,
            },
        );
    }
    complete(idr)
}

/// `rdma_leave_multicast`: the id's QP leaves the group (librdmacm detaches it unless
/// the join was send-only); EADDRNOTAVAIL for a group the id did not join.
pub(crate) fn leave_multicast(idr: IdRef, addr: SocketAddr) -> Result<()> {
    let mut c = lock();
    let st = c.state(idr)?;
    let i = (st.mcs.iter())
        .position(|m| m.addr == addr)
        .ok_or(Error::AddrNotAvail)?;
    let m = st.mcs.remove(i);
    let qp = idr.c().qp;
    if !qp.is_null() && !m.send_only {
        // SAFETY: the id's live QP and a GID on the stack. librdmacm ignores the result.
        unsafe { ibv_detach_mcast(qp, &m.mgid, 0) };
    }
    Ok(())
}

pub(crate) fn resolve_route(idr: IdRef) -> Result<()> {
    {
        let mut c = lock();
        let st = c.state(idr)?;
        if !st.addr_resolved {
            return Err(Error::Invalid(
                "rdma_resolve_route before the address is resolved",
            ));
        }
        st.route_resolved = true;
        let d = st.dev.ok_or(Error::NoDevice)?;
        let chan = st.chan;
        let dev = c.devs[d].dev.clone();
        fill_path(idr, &dev, &c.ids[&idr.key()]);
        c.push(
            chan,
            Pending {
                id: idr,
                listen: None,
                event: RDMA_CM_EVENT_ROUTE_RESOLVED,
                status: 0,
                param: Param::None,
                rep: false,
            },
        );
    }
    complete(idr)
}

pub(crate) fn listen(idr: IdRef) -> Result<()> {
    let mut c = lock();
    c.open()?;
    if c.state(idr)?.local.is_none() {
        // rdma_listen on an unbound id binds it to the wildcard and an ephemeral port.
        c.bind(
            idr,
            SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0),
        )?;
    }
    let st = c.state(idr)?;
    if st.listening {
        return Ok(());
    }
    let local = st.local.ok_or(Error::Invalid("unbound"))?;
    let ps = st.ps;
    let dev = st.dev;
    st.listening = true;
    let pspace = PortSpace::from_u16(ps).ok_or(Error::Invalid("port space"))?;
    let sid = service_id(pspace, local.port());
    for (d, e) in c.devs.iter_mut().enumerate() {
        if dev.is_some_and(|x| x != d) {
            continue;
        }
        let n = e.sids.entry(sid).or_insert(0);
        if *n == 0 {
            e.ep.listen(sid)?;
        }
        *n += 1;
    }
    c.listeners.push((ps, local.port(), local.ip(), idr.key()));
    if local.ip().is_unspecified() {
        let loopback = c
            .devs
            .get(dev.unwrap_or(0))
            .and_then(|e| e.dev.loopback_gid(true));
        if let Some((_, ip)) = loopback {
            crate::local_listeners::publish(ps, local.port(), ip);
        }
    }
    // Requests that came before the listener are due now: wake the progress threads.
    for d in 0..c.devs.len() {
        c.pump(d);
    }
    Ok(())
}

fn conn_dev(c: &Cma, idr: IdRef) -> Result<(usize, CmId)> {
    let st = c
        .ids
        .get(&idr.key())
        .ok_or(Error::Invalid("unknown rdma_cm_id"))?;
    Ok((
        st.dev.ok_or(Error::Invalid("no device"))?,
        st.cm.ok_or(Error::Invalid("not connecting"))?,
    ))
}

/// Private data of a connect: `cma_hdr` then the program's bytes.
fn cma_private(local: SocketAddr, remote: SocketAddr, user: &[u8], max: usize) -> Result<Vec<u8>> {
    if user.len() > max - CMA_HDR_LEN {
        return Err(Error::Invalid("private data too long"));
    }
    let mut pd = vec![0u8; CMA_HDR_LEN + user.len()];
    CmaHdr {
        version: 0,
        src_port: local.port(),
        src: local.ip(),
        dst: remote.ip(),
    }
    .emit(&mut pd)?;
    pd[CMA_HDR_LEN..].copy_from_slice(user);
    Ok(pd)
}

/// # Safety
/// `p`, when not NULL, points to a valid `rdma_conn_param` whose private data is valid.
unsafe fn user_private(p: Option<&rdma_conn_param>) -> Vec<u8> {
    match p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: contract.
            unsafe {
                std::slice::from_raw_parts(
                    p.private_data.cast::<u8>(),
                    usize::from(p.private_data_len),
                )
            }
            .to_vec()
        }
        _ => Vec::new(),
    }
}

/// librdmacm's `ucma_valid_param`.
fn valid_param(c: &Cma, idr: IdRef, p: Option<&rdma_conn_param>) -> Result<()> {
    let st = &c.ids[&idr.key()];
    if st.ps != PortSpace::Tcp as u16 {
        return Ok(());
    }
    if idr.c().qp.is_null() && p.is_none() {
        return Err(Error::Invalid("no QP and no connection parameters"));
    }
    if let (Some(p), Some(d)) = (p, st.dev) {
        let dev = &c.devs[d].dev;
        if (p.responder_resources != RDMA_MAX_RESP_RES && p.responder_resources > dev.max_resp_res)
            || (p.initiator_depth != RDMA_MAX_INIT_DEPTH && p.initiator_depth > dev.max_init_depth)
        {
            return Err(Error::Invalid(
                "responder resources / initiator depth above the device's",
            ));
        }
    }
    Ok(())
}

/// A connection to this process's own address with nothing here listening on its port
/// is meant for another process's listener (`Cma::local_destination`): give that
/// process a moment to listen (its server may have sent the port before listening, as
/// qperf's does), outside the lock. Otherwise the REQ goes to this process's own CM,
/// which holds it for a grace, then rejects it.
fn wait_for_local_listener(idr: IdRef) {
    let pending = {
        let c = lock();
        let Some(st) = c.ids.get(&idr.key()) else {
            return;
        };
        st.remote
            .filter(|r| c.ours_unlistened(st.ps, *r))
            .map(|r| (st.ps, r))
    };
    let Some((ps, remote)) = pending else { return };
    for _ in 0..LOCAL_LISTENER_POLLS {
        if crate::local_listeners::find(ps, remote.port(), remote.ip()).is_some() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// How many 5 ms looks [`wait_for_local_listener`] takes.
const LOCAL_LISTENER_POLLS: u32 = 40;

/// # Safety
/// `param` is NULL or a valid `rdma_conn_param`.
pub(crate) unsafe fn connect(idr: IdRef, param: *const rdma_conn_param) -> Result<()> {
    wait_for_local_listener(idr);
    {
        let mut c = lock();
        // SAFETY: contract.
        let p = unsafe { param.as_ref() };
        valid_param(&c, idr, p)?;
        let st = c.state(idr)?;
        if !st.route_resolved {
            return Err(Error::Invalid("rdma_connect before the route is resolved"));
        }
        let (d, local, remote) = (
            st.dev.ok_or(Error::NoDevice)?,
            st.local.ok_or(Error::Invalid("unbound"))?,
            st.remote.ok_or(Error::Invalid("no destination"))?,
        );
        let ps = PortSpace::from_u16(st.ps).ok_or(Error::Invalid("port space"))?;
        let remote = c.local_destination(ps as u16, remote);
        let st = c.state(idr)?;
        if st.remote != Some(remote) {
            st.remote = Some(remote);
            let dev = c.devs[d].dev.clone();
            fill_addr(idr, &dev, Some(local), Some(remote));
            idr.get_mut().path.dgid = ip_to_gid(remote.ip());
        }
        let sid = service_id(ps, remote.port());
        // SAFETY: contract.
        let user = unsafe { user_private(p) };
        let now = agent::now();
        let qp = idr.c().qp;
        let (qp_num, srq) = if qp.is_null() {
            (p.map_or(0, |p| p.qp_num), p.is_some_and(|p| p.srq != 0))
        } else {
            // SAFETY: the program's QP.
            unsafe { ((*qp).qp_num, !(*qp).srq.is_null()) }
        };
        {
            let e = &mut c.devs[d];
            e.dev.use_source(&mut e.st, remote.ip(), local.ip());
        }
        let st = c.state(idr)?;
        let cm = if st.ud {
            let mut sp = SidrRequestParams::new(remote.ip(), sid);
            sp.traffic_class = st.tos;
            sp.private_data = cma_private(
                local,
                remote,
                &user,
                softhca_cm::mad::private_data_len::SIDR_REQ,
            )?;
            c.devs[d].ep.sidr_request(now, &sp)?
        } else {
            let dev = c.devs[d].dev.clone();
            let st = c.state(idr)?;
            st.init_depth = p
                .filter(|p| p.initiator_depth != RDMA_MAX_INIT_DEPTH)
                .map_or(dev.max_init_depth, |p| p.initiator_depth);
            st.resp_res = p
                .filter(|p| p.responder_resources != RDMA_MAX_RESP_RES)
                .map_or(dev.max_resp_res, |p| p.responder_resources);
            let mut cp = ConnectParams::new(
                local.ip(),
                remote.ip(),
                sid,
                Qpn::new(qp_num),
                Psn::new(st.psn),
            );
            cp.responder_resources = st.resp_res;
            cp.initiator_depth = st.init_depth;
            cp.retry_count = p.map_or(7, |p| p.retry_count).min(7);
            cp.rnr_retry_count = p.map_or(7, |p| p.rnr_retry_count).min(7);
            cp.flow_control = p.is_some_and(|p| p.flow_control != 0);
            cp.srq = srq;
            cp.path_mtu = dev.path_mtu(local.ip());
            cp.traffic_class = st.tos;
            cp.packet_life_time = st
                .ack_timeout
                .map_or(PACKET_LIFETIME, |t| t.saturating_sub(1));
            cp.flow_label = (u32::from(local.port()) * 31 + u32::from(remote.port())) & 0xFFFFF;
            cp.private_data =
                cma_private(local, remote, &user, softhca_cm::mad::private_data_len::REQ)?;
            c.devs[d].ep.connect(now, &cp)?
        };
        c.state(idr)?.cm = Some(cm);
        c.conns.insert((d, cm), idr);
        c.pump(d);
    }
    complete(idr)
}

/// QP attributes for `state` (the kernel's `rdma_init_qp_attr` for RoCE).
pub(crate) fn qp_attr_for(c: &Cma, idr: IdRef, state: u32) -> Result<(ibv_qp_attr, c_int)> {
    let st = c
        .ids
        .get(&idr.key())
        .ok_or(Error::Invalid("unknown rdma_cm_id"))?;
    let mut a = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    match state {
        IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            if st.ud {
                a.qkey = RDMA_UDP_QKEY;
                return Ok((
                    a,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
                ));
            }
            // cma_ib_init_qp_attr gives no remote access before the CM knows the peer;
            // ib_cm_init_qp_attr then REMOTE_WRITE, plus READ/ATOMIC with responder
            // resources.
            if st.cm.is_some() {
                a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
            }
            if st.cm.is_some() && st.resp_res > 0 {
                a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
            }
            Ok((
                a,
                IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT,
            ))
        }
        IBV_QPS_RTR | IBV_QPS_RTS if st.ud => {
            // ucma_init_ud_qp: RTR with the state alone, RTS with send PSN 0.
            if state == IBV_QPS_RTS {
                a.sq_psn = 0;
                return Ok((a, IBV_QP_STATE | IBV_QP_SQ_PSN));
            }
            Ok((a, IBV_QP_STATE))
        }
        IBV_QPS_RTR | IBV_QPS_RTS => {
            let (d, cm) = conn_dev(c, idr)?;
            let attrs = c.devs[d]
                .ep
                .qp_attrs(cm)
                .ok_or(Error::Invalid("no connection"))?;
            if state == IBV_QPS_RTR {
                let remote = st.remote.ok_or(Error::Invalid("no peer"))?;
                a.path_mtu = u32::from(attrs.path_mtu);
                a.dest_qp_num = attrs.remote_qpn.value();
                a.rq_psn = st.psn;
                a.max_dest_rd_atomic = st.resp_res;
                // cm_init_qp_rtr_attr: min_rnr_timer 0 for RC.
                a.min_rnr_timer = 0;
                a.ah_attr = ah_to(st, remote.ip());
                a.ah_attr.grh.flow_label = idr.get().path.flow_label.to_be() & 0xFFFFF;
                Ok((
                    a,
                    IBV_QP_STATE
                        | IBV_QP_AV
                        | IBV_QP_PATH_MTU
                        | IBV_QP_DEST_QPN
                        | IBV_QP_RQ_PSN
                        | IBV_QP_MAX_DEST_RD_ATOMIC
                        | IBV_QP_MIN_RNR_TIMER,
                ))
            } else {
                a.timeout = st.ack_timeout.unwrap_or(attrs.ack_timeout);
                a.retry_cnt = attrs.retry_count;
                a.rnr_retry = attrs.rnr_retry_count;
                a.sq_psn = attrs.sq_psn.value();
                a.max_rd_atomic = st.init_depth;
                Ok((
                    a,
                    IBV_QP_STATE
                        | IBV_QP_TIMEOUT
                        | IBV_QP_RETRY_CNT
                        | IBV_QP_RNR_RETRY
                        | IBV_QP_SQ_PSN
                        | IBV_QP_MAX_QP_RD_ATOMIC,
                ))
            }
        }
        _ => Err(Error::Invalid("QP state")),
    }
}

/// INIT (with the CM's access flags), RTR, RTS: `ucma_modify_qp_rtr` + `_rts`.
fn qp_rtr_rts(c: &Cma, idr: IdRef) -> Result<()> {
    let qp = idr.c().qp;
    if qp.is_null() {
        return Ok(());
    }
    for s in [IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS] {
        let (mut a, m) = qp_attr_for(c, idr, s)?;
        modify(qp, &mut a, m)?;
    }
    Ok(())
}

pub(crate) fn qp_err(idr: IdRef) {
    let qp = idr.c().qp;
    if !qp.is_null() {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..Default::default()
        };
        let _ = modify(qp, &mut a, IBV_QP_STATE);
    }
}

/// # Safety
/// `param` is NULL or a valid `rdma_conn_param`.
pub(crate) unsafe fn accept(idr: IdRef, param: *const rdma_conn_param) -> Result<()> {
    let ud;
    {
        let mut c = lock();
        // SAFETY: contract.
        let p = unsafe { param.as_ref() };
        valid_param(&c, idr, p)?;
        let (d, cm) = conn_dev(&c, idr)?;
        let dev = c.devs[d].dev.clone();
        let st = c.state(idr)?;
        ud = st.ud;
        // rdma_accept: the REQ's values bounded by the device, unless the program
        // chose.
        st.init_depth = match p {
            Some(p) if p.initiator_depth != RDMA_MAX_INIT_DEPTH => p.initiator_depth,
            _ => st.init_depth.min(dev.max_init_depth),
        };
        st.resp_res = match p {
            Some(p) if p.responder_resources != RDMA_MAX_RESP_RES => p.responder_resources,
            _ => st.resp_res.min(dev.max_resp_res),
        };
        let (psn, resp_res, init_depth) = (st.psn, st.resp_res, st.init_depth);
        // SAFETY: contract.
        let user = unsafe { user_private(p) };
        let qp = idr.c().qp;
        let (qp_num, srq) = if qp.is_null() {
            (p.map_or(0, |p| p.qp_num), p.is_some_and(|p| p.srq != 0))
        } else {
            // SAFETY: the program's QP.
            unsafe { ((*qp).qp_num, !(*qp).srq.is_null()) }
        };
        let now = agent::now();
        if ud {
            let rp = SidrReplyParams {
                status: SidrStatus::Success,
                qpn: Qpn::new(qp_num),
                qkey: RDMA_UDP_QKEY,
                private_data: user,
            };
            c.devs[d].ep.sidr_reply(now, cm, &rp)?;
            c.conns.remove(&(d, cm));
            c.state(idr)?.cm = None;
        } else {
            // rdma_accept moves the QP to RTR and RTS before the REP goes out.
            if let Err(e) = qp_rtr_rts(&c, idr) {
                qp_err(idr);
                return Err(e);
            }
            let mut ap = AcceptParams::new(Qpn::new(qp_num), Psn::new(psn));
            ap.responder_resources = resp_res;
            ap.initiator_depth = init_depth;
            ap.rnr_retry_count = p.map_or(7, |p| p.rnr_retry_count).min(7);
            ap.flow_control = p.is_some_and(|p| p.flow_control != 0);
            ap.srq = srq;
            ap.private_data = user;
            if let Err(e) = c.devs[d].ep.accept(now, cm, &ap) {
                qp_err(idr);
                return Err(e.into());
            }
        }
        c.pump(d);
    }
    if ud {
        let cid = idr.c();
        let sync = lock().ids.get(&idr.key()).is_some_and(|s| s.sync);
        if sync && !cid.event.is_null() {
            ack_event(cid.event);
            cid.event = std::ptr::null_mut();
        }
        return Ok(());
    }
    complete(idr)
}

pub(crate) fn reject(idr: IdRef, private: &[u8], reason: RejReason) -> Result<()> {
    let mut c = lock();
    let (d, cm) = conn_dev(&c, idr)?;
    let now = agent::now();
    if c.ids[&idr.key()].ud {
        let rp = SidrReplyParams {
            status: SidrStatus::Reject,
            qpn: Qpn::new(0),
            qkey: 0,
            private_data: private.to_vec(),
        };
        c.devs[d].ep.sidr_reply(now, cm, &rp)?;
    } else {
        c.devs[d].ep.reject(now, cm, reason, private)?;
    }
    c.conns.remove(&(d, cm));
    c.state(idr)?.cm = None;
    c.pump(d);
    Ok(())
}

pub(crate) fn disconnect(idr: IdRef) -> Result<()> {
    {
        let mut c = lock();
        if idr.c().verbs.is_null() {
            return Err(Error::Invalid("rdma_disconnect on an id without a device"));
        }
        // ucma_shutdown: the QP goes to ERR first.
        qp_err(idr);
        let (d, cm) = conn_dev(&c, idr)?;
        // rdma_disconnect: DREQ, or the DREP when the peer's DREQ came first.
        let _ = c.devs[d].ep.disconnect(agent::now(), cm, &[]);
        c.pump(d);
    }
    complete(idr)
}

pub(crate) fn establish(idr: IdRef) -> Result<()> {
    if !idr.c().qp.is_null() {
        return Err(Error::Invalid("rdma_establish with a QP"));
    }
    let mut c = lock();
    let (d, cm) = conn_dev(&c, idr)?;
    c.devs[d].ep.establish(agent::now(), cm, &[])?;
    c.pump(d);
    Ok(())
}

pub(crate) fn notify(idr: IdRef, event: c_int) -> Result<()> {
    // IBV_EVENT_COMM_EST: the first packet arrived before the RTU (ib_cm_notify).
    if event != 4 {
        return Err(Error::Invalid("rdma_notify takes IBV_EVENT_COMM_EST only"));
    }
    let mut c = lock();
    let (d, cm) = conn_dev(&c, idr)?;
    if matches!(
        c.devs[d].ep.state(cm),
        Some(CmState::RepSent | CmState::MraRepRcvd)
    ) {
        c.devs[d].ep.establish(agent::now(), cm, &[])?;
        c.pump(d);
    }
    Ok(())
}

pub(crate) fn set_option(
    idr: IdRef,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: usize,
) -> Result<()> {
    if val.is_null() {
        return Err(Error::Invalid("NULL option value"));
    }
    let mut c = lock();
    let st = c.state(idr)?;
    // SAFETY: the caller passes `len` readable bytes at `val` (checked sizes below).
    let byte = || unsafe { *val.cast::<u8>() };
    // SAFETY: as above.
    let int = || unsafe { val.cast::<c_int>().read_unaligned() };
    match (level, name) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if len == 1 => st.tos = byte(),
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) if len == 4 => {
            if st.local.is_some() && st.port_held {
                return Err(Error::Invalid("REUSEADDR after bind"));
            }
            st.reuse = int() != 0
        }
        (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) if len == 4 => {}
        (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if len == 1 => {
            st.ack_timeout = Some(byte().min(31))
        }
        (
            RDMA_OPTION_ID,
            RDMA_OPTION_ID_TOS
            | RDMA_OPTION_ID_REUSEADDR
            | RDMA_OPTION_ID_AFONLY
            | RDMA_OPTION_ID_ACK_TIMEOUT,
        ) => return Err(Error::Invalid("option length")),
        (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
            return Err(Error::NotSupported("RDMA_OPTION_IB_PATH (no SA on RoCE)"))
        }
        _ => return Err(Error::NoSys("unknown option")),
    }
    Ok(())
}

pub(crate) fn init_qp_attr(idr: IdRef, attr: &mut ibv_qp_attr) -> Result<c_int> {
    let c = lock();
    let (a, m) = qp_attr_for(&c, idr, attr.qp_state)?;
    *attr = a;
    Ok(m)
}

/// `rdma_migrate_id`.
pub(crate) fn migrate(idr: IdRef, chan: *mut rdma_event_channel) -> Result<()> {
    let (old, was_sync) = {
        let c = lock();
        let st = c
            .ids
            .get(&idr.key())
            .ok_or(Error::Invalid("unknown rdma_cm_id"))?;
        (st.chan, st.sync)
    };
    if was_sync && chan.is_null() {
        return Err(Error::Invalid("migrating a synchronous id to synchronous"));
    }
    let (new, sync) = if chan.is_null() {
        (Channel::create()?, true)
    } else {
        (ChanRef(chan.cast()), false)
    };
    if new == old {
        return Ok(());
    }
    {
        let mut c = lock();
        // The kernel's ucma_migrate_id moves the id's queued events to the new file.
        let moved = old
            .get()
            .take(|p| p.id == idr && p.listen.is_none() || p.listen == Some(idr));
        for p in moved {
            new.get().push(p);
        }
        *old.get().users.lock() -= 1;
        *new.get().users.lock() += 1;
        let st = c.state(idr)?;
        st.chan = new;
        st.sync = sync;
        idr.c().channel = new.0.cast();
    }
    if was_sync {
        let cid = idr.c();
        if !cid.event.is_null() {
            ack_event(cid.event);
            cid.event = std::ptr::null_mut();
        }
        // SAFETY: the private channel of a synchronous id has no other user now.
        unsafe { Channel::destroy(old) };
    }
    idr.get().wait_acked();
    Ok(())
}

pub(crate) fn destroy_id(idr: IdRef) -> Result<()> {
    let (chan, sync) = {
        let mut c = lock();
        let st = c
            .ids
            .get(&idr.key())
            .ok_or(Error::Invalid("unknown rdma_cm_id"))?;
        let (chan, sync, dev, cm, listening, local, ps) = (
            st.chan,
            st.sync,
            st.dev,
            st.cm,
            st.listening,
            st.local,
            st.ps,
        );
        let now = agent::now();
        if let (Some(d), Some(cm)) = (dev, cm) {
            crate::error::debug(format_args!(
                "destroy id {:p} in CM state {:?}",
                idr.0,
                c.devs[d].ep.state(cm)
            ));
            c.devs[d].ep.destroy(now, cm);
            c.conns.remove(&(d, cm));
            c.pump(d);
        }
        if listening {
            c.listeners.retain(|l| l.3 != idr.key());
            if let Some(l) = local.filter(|l| l.ip().is_unspecified()) {
                crate::local_listeners::withdraw(ps, l.port());
            }
            if let (Some(pspace), Some(local)) = (PortSpace::from_u16(ps), local) {
                let sid = service_id(pspace, local.port());
                for (d, e) in c.devs.iter_mut().enumerate() {
                    if dev.is_some_and(|x| x != d) {
                        continue;
                    }
                    if let Some(n) = e.sids.get_mut(&sid) {
                        *n -= 1;
                        if *n == 0 {
                            e.sids.remove(&sid);
                            e.ep.unlisten(sid);
                        }
                    }
                }
            }
        }
        c.release_port(idr);
        c.conns.retain(|_, v| *v != idr);
        c.ids.remove(&idr.key());
        (chan, sync)
    };
    // Undelivered events go with the id; undelivered connection requests take their new
    // ids with them (the kernel's ucma_cleanup_ctx_events).
    let dropped = chan.get().take(|p| p.id == idr || p.listen == Some(idr));
    for p in dropped {
        if p.listen == Some(idr) && p.id != idr {
            let _ = destroy_id(p.id);
        }
    }
    let cid = idr.c();
    if sync && !cid.event.is_null() {
        ack_event(cid.event);
        cid.event = std::ptr::null_mut();
    }
    idr.get().wait_acked();
    *chan.get().users.lock() -= 1;
    if sync {
        // SAFETY: the private channel of a synchronous id, now unused.
        unsafe { Channel::destroy(chan) };
    }
    // SAFETY: the id is unreachable now: out of every table and queue, all events acked.
    drop(unsafe { Box::from_raw(idr.0) });
    Ok(())
}

/// The event as the program sees it, with its private data.
#[repr(C)]
struct EventBox {
    ev: rdma_cm_event,
    owner: IdRef,
    private: [u8; 256],
}

pub(crate) fn get_event(chan: ChanRef) -> Result<*mut rdma_cm_event> {
    loop {
        let p = chan.get().next()?;
        let owner = p.listen.unwrap_or(p.id);
        let Some((event, status)) = settle(&p) else {
            owner.get().acked();
            continue;
        };
        if event == RDMA_CM_EVENT_REJECTED {
            qp_err(p.id);
        }
        crate::error::debug(format_args!(
            "event {} status {} for id {:p}",
            event, status, p.id.0
        ));
        return Ok(event_box(p, owner, event, status));
    }
}

/// The event and status the program reads for `p`, or `None` for an event it must not see.
/// A REP for an active id with a QP moves the QP to RTR and RTS and sends the RTU here, as
/// librdmacm's `ucma_process_conn_resp` does when the program reads the event.
fn settle(p: &Pending) -> Option<(c_int, c_int)> {
    let (mut event, mut status) = (p.event, p.status);
    let mut c = lock();
    if p.rep && p.id.c().qp.is_null() {
        event = RDMA_CM_EVENT_CONNECT_RESPONSE;
    } else if p.rep {
        let r = qp_rtr_rts(&c, p.id).and_then(|_| {
            let (d, cm) = conn_dev(&c, p.id)?;
            c.devs[d].ep.establish(agent::now(), cm, &[])?;
            c.pump(d);
            Ok(())
        });
        match r {
            Ok(()) => event = RDMA_CM_EVENT_ESTABLISHED,
            Err(e) => {
                qp_err(p.id);
                event = RDMA_CM_EVENT_CONNECT_ERROR;
                status = -e.errno();
                if let Some(s) = c.ids.get_mut(&p.id.key()) {
                    s.connect_error = true;
                }
            }
        }
    }
    if let Param::Mcast {
        ah_attr,
        attach: true,
        ..
    } = &p.param
    {
        let qp = p.id.c().qp;
        // SAFETY: the id's live QP and the event's GID.
        let r = if qp.is_null() {
            0
        } else {
            unsafe { ibv_attach_mcast(qp, &ah_attr.grh.dgid, 0) }
        };
        // ucma_process_join returns rdma_seterrno's -1 (errno set), which becomes the
        // event's status.
        if r != 0 {
            event = RDMA_CM_EVENT_MULTICAST_ERROR;
            status = -1;
            crate::error::set_errno(r);
        }
    }
    // After a CONNECT_ERROR the program sees no REJECTED or DISCONNECTED for that id.
    let connect_error = c.ids.get(&p.id.key()).is_some_and(|s| s.connect_error);
    let hidden = event == RDMA_CM_EVENT_REJECTED || event == RDMA_CM_EVENT_DISCONNECTED;
    (!(connect_error && hidden)).then_some((event, status))
}

/// Copies up to 255 bytes of private data (the `u8` length field's limit) into `buf`.
fn copy_private(buf: &mut [u8; 256], private: &[u8]) -> u8 {
    let n = private.len().min(255);
    buf[..n].copy_from_slice(&private[..n]);
    n as u8
}

/// The `rdma_cm_event` the program reads, boxed with its private data.
fn event_box(p: Pending, owner: IdRef, event: c_int, status: c_int) -> *mut rdma_cm_event {
    // SAFETY: all-zero is a valid rdma_cm_event (pointers NULL).
    let mut b = Box::new(EventBox {
        ev: unsafe { std::mem::zeroed() },
        owner,
        private: [0; 256],
    });
    b.ev.id = p.id.0.cast();
    b.ev.listen_id = p.listen.map_or(std::ptr::null_mut(), |l| l.0.cast());
    b.ev.event = event;
    b.ev.status = status;
    let mut private_len = 0;
    match p.param {
        Param::None => {}
        Param::Conn {
            private,
            responder_resources,
            initiator_depth,
            flow_control,
            retry_count,
            rnr_retry_count,
            srq,
            qp_num,
        } => {
            private_len = copy_private(&mut b.private, &private);
            b.ev.param.conn = rdma_conn_param {
                private_data: std::ptr::null(),
                private_data_len: private_len,
                responder_resources,
                initiator_depth,
                flow_control,
                retry_count,
                rnr_retry_count,
                srq,
                qp_num,
            };
        }
        Param::Ud {
            private,
            ah_attr,
            qp_num,
            qkey,
        } => {
            private_len = copy_private(&mut b.private, &private);
            b.ev.param.ud = rdma_ud_param {
                private_data: std::ptr::null(),
                private_data_len: private_len,
                ah_attr,
                qp_num,
                qkey,
            };
        }
        Param::Mcast {
            ah_attr,
            qkey,
            context,
            ..
        } => {
            b.ev.param.ud = rdma_ud_param {
                private_data: context as *const c_void,
                private_data_len: 0,
                ah_attr,
                qp_num: MULTICAST_QPN,
                qkey,
            };
        }
    }
    let raw = Box::into_raw(b);
    if private_len > 0 {
        // `private_data` leads both rdma_conn_param and rdma_ud_param, so one write sets
        // whichever the union holds.
        // SAFETY: `raw` is our fresh allocation.
        unsafe { (*raw).ev.param.conn.private_data = (*raw).private.as_ptr().cast() };
    }
    raw.cast()
}

pub(crate) fn ack_event(ev: *mut rdma_cm_event) {
    // SAFETY: events come from get_event (an EventBox, whose first field is the event).
    let b = unsafe { Box::from_raw(ev.cast::<EventBox>()) };
    b.owner.get().acked();
}

/// `rdma_get_devices`: the verbs contexts of the CM agents.
pub(crate) fn devices() -> Result<Vec<*mut ibv_context>> {
    let mut c = lock();
    c.open()?;
    Ok(c.devs.iter().map(|d| d.dev.ctx).collect())
}

pub(crate) fn destroy_event_channel(ch: ChanRef) -> Result<()> {
    if *ch.get().users.lock() > 0 {
        return Err(Error::Busy);
    }
    // SAFETY: no id uses it.
    unsafe { Channel::destroy(ch) };
    Ok(())
}

pub(crate) fn qp_init_attr_of(idr: IdRef) -> Option<ibv_qp_init_attr> {
    lock().ids.get(&idr.key()).and_then(|s| s.qp_init_attr)
}

pub(crate) fn set_qp_init_attr(idr: IdRef, a: ibv_qp_init_attr) {
    if let Some(s) = lock().ids.get_mut(&idr.key()) {
        s.qp_init_attr = Some(a);
    }
}

pub(crate) fn is_sync(idr: IdRef) -> bool {
    lock().ids.get(&idr.key()).is_some_and(|s| s.sync)
}
