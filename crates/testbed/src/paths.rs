//! N parallel paths between two network namespaces, for multipath transports: veth pairs
//! `<name>a<i>` (10.62.i.1/24) — `<name>b<i>` (10.62.i.2/24), each shaped by tbf on both
//! ends, plus an unshaped management pair that is never cut.
//!
//! Two ways to use the paths, both set up at once:
//! - address pairs: 10.62.i.1 ↔ 10.62.i.2 is path i (a dual-NIC host);
//! - ECMP by UDP source port: a loopback /32 per side (10.63.0.1, 10.63.0.2) reached by a
//!   multipath route over every path with `fib_multipath_hash_policy=1` (L4 hash), so a
//!   packet's source port picks its path ([`Paths::ecmp_path`] says which).
//!
//! Faults are nftables rules in each namespace's prerouting hook at priority raw, one
//! chain per path, on the receiving end: a silent black hole in either or both
//! directions, or random loss (`numgen random`). The kernel here has no netem, so a slow
//! path is a lower tbf rate ([`Paths::set_rate`]). TCP ports [`CONTROL_PORTS`] (the
//! control connections of `softhca perf`) always take the management pair, so a cut
//! stops only the traffic under test.
//!
//! MPTCP is configured too: end B announces its path addresses (`ip mptcp endpoint ...
//! signal`), so a connection to 10.62.0.2 opens one subflow per path.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use crate::{check_available, ip, netns_command, netns_name, valid_name, End, TestbedError};

/// TCP ports routed over the management pair (both as destination and as source).
pub const CONTROL_PORTS: (u16, u16) = (18500, 18599);

/// The routing table of the management routes.
const CONTROL_TABLE: &str = "62";
/// A veth's default `gso_max_segs` (Linux `GSO_MAX_SEGS`): GSO datagrams pass whole.
const GSO_MAX_SEGS: &str = "65535";

/// Which direction of a path a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From end A to end B (the data direction when A sends).
    AToB,
    /// From end B to end A (the ACK direction when A sends).
    BToA,
    /// Both directions.
    Both,
}

impl Direction {
    /// The receiving ends whose ingress the fault is applied at.
    fn receivers(self) -> &'static [End] {
        match self {
            Direction::AToB => &[End::B],
            Direction::BToA => &[End::A],
            Direction::Both => &[End::A, End::B],
        }
    }
}

/// What happens to a path's packets (in one direction).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Delivered.
    Clear,
    /// Silently dropped (a black hole: the link stays up).
    Cut,
    /// Each packet dropped with this probability (0..1).
    Loss(f64),
}

/// One path's counters: bytes and packets each end sent on it, packets the nftables
/// faults dropped on arrival and packets the token buckets dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Bytes sent by end A on the path (veth tx).
    pub ab_bytes: u64,
    /// Bytes sent by end B.
    pub ba_bytes: u64,
    /// Packets sent by end A.
    pub ab_pkts: u64,
    /// Packets sent by end B.
    pub ba_pkts: u64,
    /// Packets from A that a fault dropped at B.
    pub ab_faulted: u64,
    /// Packets from B that a fault dropped at A.
    pub ba_faulted: u64,
    /// Packets A's token bucket dropped.
    pub ab_shaper_drops: u64,
    /// Packets B's token bucket dropped.
    pub ba_shaper_drops: u64,
}

impl PathStats {
    /// The counts since `before`.
    pub fn since(&self, before: &PathStats) -> PathStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        PathStats {
            ab_bytes: d(self.ab_bytes, before.ab_bytes),
            ba_bytes: d(self.ba_bytes, before.ba_bytes),
            ab_pkts: d(self.ab_pkts, before.ab_pkts),
            ba_pkts: d(self.ba_pkts, before.ba_pkts),
            ab_faulted: d(self.ab_faulted, before.ab_faulted),
            ba_faulted: d(self.ba_faulted, before.ba_faulted),
            ab_shaper_drops: d(self.ab_shaper_drops, before.ab_shaper_drops),
            ba_shaper_drops: d(self.ba_shaper_drops, before.ba_shaper_drops),
        }
    }
}

/// N shaped paths between two namespaces; dropping it deletes them (unless
/// [`Paths::keep`] was called).
#[derive(Debug)]
pub struct Paths {
    name: String,
    rates: Vec<u64>,
    keep: bool,
}

/// The `tbf` arguments after `rate`: the shaped link's (see [`crate::ShapedLink`]).
const TBF_TAIL: [&str; 4] = ["burst", "256kb", "latency", "5ms"];

impl Paths {
    /// Builds `rates.len()` paths (1..=16), path i shaped at `rates[i]` bits per second on
    /// both ends. Needs root, iproute2, tc and nft.
    pub fn up(name: &str, rates: &[u64]) -> Result<Paths, TestbedError> {
        check_available()?;
        if !valid_name(name) || name.len() > 11 {
            return Err(TestbedError::BadName(name.to_owned()));
        }
        if rates.is_empty() || rates.len() > 16 || rates.contains(&0) {
            return Err(TestbedError::Command {
                cmd: "paths".into(),
                stderr: format!("1 to 16 paths of non-zero rate, not {rates:?}"),
            });
        }
        let nft = Command::new("nft").arg("--version").output();
        if !nft.is_ok_and(|o| o.status.success()) {
            return Err(TestbedError::Command {
                cmd: "nft --version".into(),
                stderr: "nftables is missing (apt-get install nftables)".into(),
            });
        }
        crate::remove_namespaces(name);
        let p = Paths {
            name: name.to_owned(),
            rates: rates.to_vec(),
            keep: false,
        };
        // From here on, Drop removes whatever was made if a step fails.
        for end in [End::A, End::B] {
            ip(&["netns", "add", &p.netns(end)])?;
            p.sysctls(end)?;
        }
        for (i, &rate) in rates.iter().enumerate() {
            p.pair(
                &p.dev(End::A, i),
                &p.dev(End::B, i),
                p.addr(End::A, i),
                p.addr(End::B, i),
            )?;
            for end in [End::A, End::B] {
                p.tbf("add", end, i, rate)?;
                let a2 = format!("{}/24", p.addr2(end, i));
                ip(&[
                    "-n",
                    &p.netns(end),
                    "addr",
                    "add",
                    &a2,
                    "dev",
                    &p.dev(end, i),
                ])?;
            }
        }
        let (ma, mb) = (p.mgmt(End::A), p.mgmt(End::B));
        p.pair(
            &ma,
            &mb,
            Ipv4Addr::new(10, 62, 255, 1),
            Ipv4Addr::new(10, 62, 255, 2),
        )?;
        for end in [End::A, End::B] {
            p.routes(end)?;
            p.run(end, "nft", ["-f", "-"], Some(&p.nft_table()))?;
        }
        p.mptcp()?;
        Ok(p)
    }

    /// A running set of paths built by [`Paths::up`] under `name` (and kept), for the
    /// commands that change one path while traffic runs.
    pub fn attach(name: &str) -> Result<Paths, TestbedError> {
        check_available()?;
        if !valid_name(name) || name.len() > 11 {
            return Err(TestbedError::BadName(name.to_owned()));
        }
        let mut p = Paths {
            name: name.to_owned(),
            rates: Vec::new(),
            keep: true,
        };
        let missing = || TestbedError::Command {
            cmd: format!("paths {name}"),
            stderr: format!("no paths named {name} (run `softhca-impair paths up --name {name}`)"),
        };
        let text = p
            .run(End::A, "tc", ["qdisc", "show"], None)
            .map_err(|_| missing())?;
        let mut rates = BTreeMap::new();
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let dev = w
                .iter()
                .position(|x| *x == "dev")
                .and_then(|i| w.get(i + 1));
            let rate = w
                .iter()
                .position(|x| *x == "rate")
                .and_then(|i| w.get(i + 1));
            let idx = dev.and_then(|d| d.strip_prefix(&format!("{name}a")));
            if let (Some(i), Some(r)) = (idx.and_then(|i| i.parse::<usize>().ok()), rate) {
                rates.insert(i, parse_rate(r).unwrap_or(0));
            }
        }
        if rates.is_empty() {
            return Err(missing());
        }
        p.rates = rates.into_values().collect();
        Ok(p)
    }

    /// Leaves the namespaces in place when this value is dropped.
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Per-namespace settings: L4 ECMP hash, no reverse-path filter (replies of a
    /// sprayed flow come back on other paths), no IPv6 noise, MPTCP on.
    fn sysctls(&self, end: End) -> Result<(), TestbedError> {
        let ns = self.netns(end);
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let mut c = netns_command(&ns, OsStr::new("sysctl"));
        c.arg("-qw").args([
            "net.ipv4.fib_multipath_hash_policy=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.conf.all.ignore_routes_with_linkdown=1",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            "net.mptcp.enabled=1",
        ]);
        run_command(c, None).map(drop)
    }

    /// A veth pair between the namespaces.
    fn pair(&self, da: &str, db: &str, aa: Ipv4Addr, ab: Ipv4Addr) -> Result<(), TestbedError> {
        let (na, nb) = (self.netns(End::A), self.netns(End::B));
        crate::veth::veth_pair([(&na, da, aa), (&nb, db, ab)])
    }

    fn tbf(&self, verb: &str, end: End, i: usize, rate: u64) -> Result<(), TestbedError> {
        let dev = self.dev(end, i);
        let rate = format!("{rate}bit");
        let args = ["qdisc", verb, "dev", &dev, "root", "tbf", "rate", &rate];
        self.run(end, "tc", args.iter().chain(TBF_TAIL.iter()), None)
            .map(drop)
    }

    /// The loopback /32, its multipath route over every path, and the management
    /// routes of the control ports.
    fn routes(&self, end: End) -> Result<(), TestbedError> {
        let ns = self.netns(end);
        let (me, peer) = (self.loopback(end), self.loopback(end.other()));
        for (me, peer) in [
            (me, peer),
            (self.loopback2(end), self.loopback2(end.other())),
        ] {
            ip(&["-n", &ns, "addr", "add", &format!("{me}/32"), "dev", "lo"])?;
            let mut args: Vec<String> = ["-n", &ns, "route", "add", &format!("{peer}/32")]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.extend(["src".into(), me.to_string()]);
            for i in 0..self.len() {
                let via = self.addr(end.other(), i).to_string();
                args.extend(["nexthop", "via", &via, "dev", &self.dev(end, i)].map(String::from));
            }
            ip(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
        let gw = match end {
            End::A => "10.62.255.2",
            End::B => "10.62.255.1",
        };
        let mgmt = self.mgmt(end);
        for net in ["10.62.0.0/16", "10.63.0.0/16"] {
            ip(&[
                "-n",
                &ns,
                "route",
                "add",
                net,
                "via",
                gw,
                "dev",
                &mgmt,
                "table",
                CONTROL_TABLE,
            ])?;
        }
        let ports = format!("{}-{}", CONTROL_PORTS.0, CONTROL_PORTS.1);
        for side in ["dport", "sport"] {
            ip(&[
                "-n",
                &ns,
                "rule",
                "add",
                "ipproto",
                "tcp",
                side,
                &ports,
                "table",
                CONTROL_TABLE,
                "priority",
                "100",
            ])?;
        }
        Ok(())
    }

    /// The nftables table: a prerouting chain that jumps to path i's chain for packets
    /// arriving on path i (both ends' device names, so one text serves both).
    fn nft_table(&self) -> String {
        let mut t = String::from("table inet mpb {\n");
        for i in 0..self.len() {
            // A named counter outlives the rules that change with each fault.
            t += &format!("  counter c{i} {{ }}\n  chain p{i} {{ }}\n");
        }
        t += "  chain pre { type filter hook prerouting priority raw; policy accept;\n";
        for i in 0..self.len() {
            let (a, b) = (self.dev(End::A, i), self.dev(End::B, i));
            t += &format!("    iifname {{ \"{a}\", \"{b}\" }} jump p{i}\n");
        }
        t + "  }\n}\n"
    }

    /// MPTCP: up to 8 subflows each way; end B announces every path's address.
    fn mptcp(&self) -> Result<(), TestbedError> {
        for end in [End::A, End::B] {
            let ns = self.netns(end);
            ip(&[
                "-n",
                &ns,
                "mptcp",
                "limits",
                "set",
                "subflows",
                "8",
                "add_addr_accepted",
                "8",
            ])?;
        }
        let nb = self.netns(End::B);
        for i in 1..self.len() {
            let addr = self.addr(End::B, i).to_string();
            let dev = self.dev(End::B, i);
            ip(&[
                "-n", &nb, "mptcp", "endpoint", "add", &addr, "dev", &dev, "signal",
            ])?;
        }
        Ok(())
    }

    /// Sets the fault of path `i` in direction `dir` (replacing the previous one).
    /// Random loss is per packet: while it is set, the devices sending into the path cut
    /// GSO datagrams into packets before it.
    pub fn set_fault(&self, i: usize, dir: Direction, fault: Fault) -> Result<(), TestbedError> {
        self.check_index(i)?;
        let rule = match fault {
            Fault::Clear => String::new(),
            Fault::Cut => format!("counter name c{i} drop"),
            Fault::Loss(p) => {
                let per_million = (p.clamp(0.0, 1.0) * 1e6).round() as u64;
                format!("numgen random mod 1000000 < {per_million} counter name c{i} drop")
            }
        };
        let text = if rule.is_empty() {
            format!("flush chain inet mpb p{i}\n")
        } else {
            format!("flush chain inet mpb p{i}\nadd rule inet mpb p{i} {rule}\n")
        };
        // Both ends at once: a two-way cut should not start as a one-way one.
        let children: Vec<_> = dir
            .receivers()
            .iter()
            .map(|&end| {
                let mut c = self.command(end, "nft");
                c.args(["-f", "-"]);
                spawn_with_input(c, &text)
            })
            .collect();
        for c in children {
            let st = c?.wait()?;
            if !st.success() {
                return Err(TestbedError::Command {
                    cmd: format!("nft -f - <<< {text:?}"),
                    stderr: format!("exited with {st}"),
                });
            }
        }
        // Random loss drops packets, as a lossy link does: the senders into it cut
        // their GSO datagrams before the link (a veth passes them whole, and the
        // receiving end's rule dropped one 64 KiB run of packets as one).
        let segs = if matches!(fault, Fault::Loss(_)) {
            "1"
        } else {
            GSO_MAX_SEGS
        };
        for &end in dir.receivers() {
            let from = match end {
                End::A => End::B,
                End::B => End::A,
            };
            let dev = self.dev(from, i);
            self.run(
                from,
                "ip",
                ["link", "set", "dev", &dev, "gso_max_segs", segs],
                None,
            )?;
        }
        Ok(())
    }

    /// Changes path `i`'s token bucket rate on both ends.
    pub fn set_rate(&mut self, i: usize, rate: u64) -> Result<(), TestbedError> {
        self.check_index(i)?;
        for end in [End::A, End::B] {
            self.tbf("change", end, i, rate)?;
        }
        self.rates[i] = rate;
        Ok(())
    }

    fn check_index(&self, i: usize) -> Result<(), TestbedError> {
        if i < self.len() {
            Ok(())
        } else {
            Err(TestbedError::Command {
                cmd: format!("path {i}"),
                stderr: format!("there are {} paths (0..{})", self.len(), self.len()),
            })
        }
    }

    /// Every path's counters.
    pub fn stats(&self) -> Result<Vec<PathStats>, TestbedError> {
        let mut out = vec![PathStats::default(); self.len()];
        for end in [End::A, End::B] {
            let links = self.run(end, "ip", ["-s", "-j", "link", "show"], None)?;
            let links: serde_json::Value =
                serde_json::from_str(&links).map_err(|e| TestbedError::Command {
                    cmd: "ip -s -j link show".into(),
                    stderr: e.to_string(),
                })?;
            let qdiscs = self.run(end, "tc", ["-s", "qdisc", "show"], None)?;
            let nft = self.run(end, "nft", ["list", "table", "inet", "mpb"], None)?;
            let faulted = parse_nft_counters(&nft);
            for (i, s) in out.iter_mut().enumerate() {
                let dev = self.dev(end, i);
                let (bytes, pkts) = tx_of(&links, &dev);
                let drops = qdisc_of(&qdiscs, &dev).dropped;
                let f = faulted.get(&i).copied().unwrap_or(0);
                match end {
                    End::A => {
                        (s.ab_bytes, s.ab_pkts, s.ab_shaper_drops) = (bytes, pkts, drops);
                        s.ba_faulted = f;
                    }
                    End::B => {
                        (s.ba_bytes, s.ba_pkts, s.ba_shaper_drops) = (bytes, pkts, drops);
                        s.ab_faulted = f;
                    }
                }
            }
        }
        Ok(out)
    }

    /// The path a UDP packet from A's loopback address with source port `sport` to B's
    /// (port `dport`) takes, by the kernel's ECMP hash (`ip route get`).
    pub fn ecmp_path(&self, sport: u16, dport: u16) -> Result<usize, TestbedError> {
        let (from, to) = (self.loopback(End::A), self.loopback(End::B));
        let text = self.run(
            End::A,
            "ip",
            [
                "route",
                "get",
                &to.to_string(),
                "from",
                &from.to_string(),
                "ipproto",
                "udp",
                "sport",
                &sport.to_string(),
                "dport",
                &dport.to_string(),
            ],
            None,
        )?;
        (0..self.len())
            .find(|&i| text.split_whitespace().any(|w| w == self.dev(End::A, i)))
            .ok_or(TestbedError::Command {
                cmd: "ip route get".into(),
                stderr: format!("no path in {text:?}"),
            })
    }

    /// How many paths.
    pub fn len(&self) -> usize {
        self.rates.len()
    }

    /// Never true: there is at least one path.
    pub fn is_empty(&self) -> bool {
        self.rates.is_empty()
    }

    /// Path `i`'s rate, bits per second.
    pub fn rate(&self, i: usize) -> u64 {
        self.rates[i]
    }

    /// The sum of the path rates, bits per second.
    pub fn total_rate(&self) -> u64 {
        self.rates.iter().sum()
    }

    /// The base name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace of `end`.
    pub fn netns(&self, end: End) -> String {
        netns_name(&self.name, end)
    }

    /// Path `i`'s device at `end`.
    pub fn dev(&self, end: End, i: usize) -> String {
        format!("{}{}{i}", self.name, end.letter())
    }

    /// The management device at `end`.
    pub fn mgmt(&self, end: End) -> String {
        format!("{}{}m", self.name, end.letter())
    }

    /// Path `i`'s address at `end`: 10.62.i.1 (A) or 10.62.i.2 (B).
    pub fn addr(&self, end: End, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 62, i as u8, end.host())
    }

    /// Path `i`'s second address at `end` (10.62.i.11 or .12), for a second device in
    /// the namespace (each device binds UDP 4791 on its own addresses).
    pub fn addr2(&self, end: End, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 62, i as u8, 10 + end.host())
    }

    /// The second loopback address of `end` (10.63.0.11 or .12).
    pub fn loopback2(&self, end: End) -> Ipv4Addr {
        Ipv4Addr::new(10, 63, 0, 10 + end.host())
    }

    /// Every path address of `end`.
    pub fn addrs(&self, end: End) -> Vec<Ipv4Addr> {
        (0..self.len()).map(|i| self.addr(end, i)).collect()
    }

    /// The loopback address of `end` (ECMP mode): 10.63.0.1 or 10.63.0.2.
    pub fn loopback(&self, end: End) -> Ipv4Addr {
        Ipv4Addr::new(10, 63, 0, end.host())
    }

    /// `ip netns exec <ns of end> <program>`.
    pub fn command(&self, end: End, program: impl AsRef<OsStr>) -> Command {
        netns_command(&self.netns(end), program.as_ref())
    }

    fn run<I, S>(
        &self,
        end: End,
        program: &str,
        args: I,
        input: Option<&str>,
    ) -> Result<String, TestbedError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.command(end, program);
        c.args(args);
        run_command(c, input)
    }
}

impl Drop for Paths {
    fn drop(&mut self) {
        if !self.keep {
            crate::remove_namespaces(&self.name);
        }
    }
}

impl End {
    fn other(self) -> End {
        match self {
            End::A => End::B,
            End::B => End::A,
        }
    }

    fn letter(self) -> char {
        match self {
            End::A => 'a',
            End::B => 'b',
        }
    }

    fn host(self) -> u8 {
        match self {
            End::A => 1,
            End::B => 2,
        }
    }
}

fn spawn_with_input(mut c: Command, input: &str) -> Result<std::process::Child, TestbedError> {
    use std::io::Write;
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes())?;
    }
    Ok(child)
}

/// Runs `c` (with `input` on stdin), returning its stdout, or its stderr as the error.
fn run_command(mut c: Command, input: Option<&str>) -> Result<String, TestbedError> {
    let cmd = format!("{c:?}");
    let child = match input {
        Some(text) => {
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
            spawn_with_input(c, text)?
        }
        None => c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    };
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(TestbedError::Command {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `tc`/`ip` rates: `1gbit`, `100Mbit`, `1000000bit`, `1Gbit`.
pub fn parse_rate(s: &str) -> Option<u64> {
    let l = s.to_ascii_lowercase();
    let (num, mult) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]
        .iter()
        .find_map(|(suf, m)| l.strip_suffix(suf).map(|n| (n.to_string(), *m)))
        .unwrap_or((l.clone(), 1.0));
    let v: f64 = num.parse().ok()?;
    (v > 0.0).then_some((v * mult).round() as u64)
}

/// tx bytes and packets of `dev` in `ip -s -j link show` output.
fn tx_of(links: &serde_json::Value, dev: &str) -> (u64, u64) {
    links
        .as_array()
        .and_then(|a| a.iter().find(|l| l["ifname"] == dev))
        .map(|l| {
            let tx = &l["stats64"]["tx"];
            (
                tx["bytes"].as_u64().unwrap_or(0),
                tx["packets"].as_u64().unwrap_or(0),
            )
        })
        .unwrap_or((0, 0))
}

/// The counters of `dev`'s qdisc in `tc -s qdisc show` output (all devices).
fn qdisc_of(text: &str, dev: &str) -> crate::QdiscStats {
    let mut block = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("qdisc ") {
            if inside {
                break;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            inside = w.windows(2).any(|p| p[0] == "dev" && p[1] == dev);
        }
        if inside {
            block += line;
            block.push('\n');
        }
    }
    crate::shaped::parse_qdisc(&block)
}

/// Packets dropped by each path's faults: the named counters `c<i>` (`counter c1 {
/// packets N bytes M }` in `nft list table`).
fn parse_nft_counters(text: &str) -> BTreeMap<usize, u64> {
    let mut out = BTreeMap::new();
    let mut chain = None;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first() {
            Some(&"counter") => {
                chain = w
                    .get(1)
                    .and_then(|c| c.strip_prefix('c'))
                    .and_then(|n| n.parse::<usize>().ok());
            }
            Some(&"chain") => chain = None,
            _ => {}
        }
        let pkts = w
            .windows(2)
            .find(|p| p[0] == "packets")
            .and_then(|p| p[1].parse::<u64>().ok());
        if let (Some(c), Some(n)) = (chain, pkts) {
            *out.entry(c).or_insert(0) += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("1gbit"), Some(1_000_000_000));
        assert_eq!(parse_rate("100Mbit"), Some(100_000_000));
        assert_eq!(parse_rate("2.5Gbit"), Some(2_500_000_000));
        assert_eq!(parse_rate("1000bit"), Some(1000));
        assert_eq!(parse_rate("fast"), None);
    }

    #[test]
    fn nft_counters_per_chain() {
        let text = "table inet mpb {\n\tcounter c0 {\n\t\tpackets 0 bytes 0\n\t}\n\
                    \tcounter c1 {\n\t\tpackets 12 bytes 4000\n\t}\n\tchain p1 {\n\t\tcounter name \"c1\" drop\n\t}\n\
                    \tcounter c2 {\n\t\tpackets 3 bytes 9\n\t}\n}\n";
        let c = parse_nft_counters(text);
        assert_eq!(c.get(&0), Some(&0));
        assert_eq!(c.get(&1), Some(&12));
        assert_eq!(c.get(&2), Some(&3));
    }

    #[test]
    fn qdisc_per_device() {
        let text = "qdisc noqueue 0: dev lo root refcnt 2 \n Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0) \n\
                    qdisc tbf 8001: dev mpbxa0 root refcnt 9 rate 1Gbit burst 256Kb lat 5ms \n Sent 10 bytes 7 pkt (dropped 2, overlimits 0 requeues 0) \n\
                    qdisc tbf 8002: dev mpbxa1 root refcnt 9 rate 1Gbit burst 256Kb lat 5ms \n Sent 10 bytes 9 pkt (dropped 5, overlimits 0 requeues 0) \n";
        assert_eq!(qdisc_of(text, "mpbxa1").dropped, 5);
        assert_eq!(qdisc_of(text, "mpbxa0").sent, 7);
        assert_eq!(qdisc_of(text, "mpbxa9").sent, 0);
    }
}
