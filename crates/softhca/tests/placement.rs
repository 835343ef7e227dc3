//! `SOFTHCA_CPU=auto` under a restricted affinity mask (what `taskset` or a container's
//! cpuset gives a process): the datapath thread lands on an allowed CPU, and the kernel
//! agrees (`Cpus_allowed_list` of the thread).

use std::net::IpAddr;

use softhca::{Config, Context, CpuPin};

/// Restricts the calling thread to `cpu` (threads it spawns inherit the mask).
fn restrict_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain bits; CPU_SET gets an index below the mask size.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(rc, 0, "sched_setaffinity");
}

/// `Cpus_allowed_list` of this process's thread called `name`.
fn cpus_of(name: &str) -> Option<String> {
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = t.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if name.starts_with(comm.trim()) {
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let line = status
                .lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))?;
            return line.split_whitespace().nth(1).map(str::to_string);
        }
    }
    None
}

/// The thread names and pins itself once it runs: wait up to 5 s for `want`.
fn thread_cpus(name: &str, want: &str) -> Option<String> {
    let start = std::time::Instant::now();
    loop {
        let got = cpus_of(name);
        if got.as_deref() == Some(want) || start.elapsed().as_secs() >= 5 {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn auto_pins_inside_the_allowed_set() {
    let cpus = softhca_io::allowed_cpus().unwrap();
    let last = *cpus.last().unwrap();
    // Another thread, so that the mask of the test harness stays as it was.
    std::thread::spawn(move || {
        restrict_to(last);
        let addr: IpAddr = "127.0.40.1".parse().unwrap();
        let cfg = Config {
            cpu: Some(CpuPin::Auto),
            name: "pa".into(),
            ..Config::loopback(addr)
        };
        let ctx = Context::open(&cfg).unwrap();
        let p = ctx.placement().unwrap().clone();
        assert_eq!(
            (p.cpu, p.auto, p.allowed.to_string()),
            (last, true, last.to_string())
        );
        // An explicit address that no interface holds: no interface to be near.
        assert_eq!(p.netdev, None);
        let want = last.to_string();
        assert_eq!(thread_cpus("softhca-dp-pa", &want).as_deref(), Some(&*want));
    })
    .join()
    .unwrap();
}

#[test]
fn a_given_cpu_is_kept() {
    let cfg = Config {
        cpu: Some(CpuPin::Cpu(0)),
        name: "pc".into(),
        ..Config::loopback("127.0.40.2".parse().unwrap())
    };
    let ctx = Context::open(&cfg).unwrap();
    let p = ctx.placement().unwrap();
    assert_eq!((p.cpu, p.auto), (0, false));
    assert_eq!(p.to_string(), "0 (SOFTHCA_CPU)");
    assert_eq!(thread_cpus("softhca-dp-pc", "0").as_deref(), Some("0"));
}
