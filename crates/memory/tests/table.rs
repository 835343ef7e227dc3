//! Behaviour of the memory table: registration, keys, every refusal, data movement.

use softhca_memory::{
    AccessFlags, AtomicOp, MemError, MemoryTable, MrKeys, PdId, Rereg, Sge, Translation,
};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const RW: AccessFlags = AccessFlags::REMOTE_WRITE;
const RR: AccessFlags = AccessFlags::REMOTE_READ;
const RA: AccessFlags = AccessFlags::REMOTE_ATOMIC;

fn all() -> AccessFlags {
    LW | RW | RR | RA
}

/// Register `buf` at its own address (`ibv_reg_mr`).
fn reg(t: &mut MemoryTable, pd: PdId, buf: &mut [u8], access: AccessFlags) -> MrKeys {
    let addr = buf.as_mut_ptr();
    // SAFETY: every test keeps `buf` alive and unborrowed until after the table is done.
    unsafe { t.register(pd, addr, buf.len(), addr as u64, access) }.expect("register")
}

fn reg_iova(
    t: &mut MemoryTable,
    pd: PdId,
    buf: &mut [u8],
    iova: u64,
    access: AccessFlags,
) -> Result<MrKeys, MemError> {
    // SAFETY: as in `reg`.
    unsafe { t.register(pd, buf.as_mut_ptr(), buf.len(), iova, access) }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn register_query_deregister() {
    let mut t = MemoryTable::new(1);
    let pd = t.alloc_pd();
    let mut a = pattern(64);
    let mut b = pattern(64);
    let ka = reg(&mut t, pd, &mut a, all());
    let kb = reg(&mut t, pd, &mut b, LW);
    assert_eq!(ka.lkey, ka.rkey, "remote rights: rkey equals lkey, as rxe");
    assert_eq!(kb.rkey, 0, "no remote rights: rkey 0, as rxe");
    assert_ne!(ka.lkey, kb.lkey);
    assert_eq!(t.mr_count(), 2);
    assert_eq!(t.pd_count(), 1);
    assert_eq!(t.pd_mr_count(pd), 2);

    let info = t.query(ka.lkey).expect("query");
    assert_eq!(info.pd, pd);
    assert_eq!(info.addr, a.as_mut_ptr());
    assert_eq!(info.len, 64);
    assert_eq!(info.iova, a.as_ptr() as u64);
    assert_eq!(info.access, all());
    assert_eq!((info.lkey, info.rkey), (ka.lkey, ka.rkey));

    assert_eq!(t.dealloc_pd(pd), Err(MemError::Busy));
    t.deregister(ka.lkey).expect("dereg");
    assert_eq!(t.mr_count(), 1);
    assert!(t.query(ka.lkey).is_none());
    assert_eq!(
        t.deregister(ka.lkey),
        Err(MemError::InvalidKey { key: ka.lkey })
    );
    // The dead key resolves neither locally nor remotely.
    let mut out = [0u8; 4];
    let sge = [Sge {
        addr: a.as_ptr() as u64,
        length: 4,
        lkey: ka.lkey,
    }];
    assert_eq!(
        t.gather(pd, &sge, 0, &mut out),
        Err(MemError::InvalidKey { key: ka.lkey })
    );
    assert_eq!(
        t.remote_write(pd, ka.rkey, a.as_ptr() as u64, &[9; 4]),
        Err(MemError::InvalidKey { key: ka.rkey })
    );
    assert_eq!(a, pattern(64));
    t.deregister(kb.lkey).expect("dereg");
    assert_eq!(t.dealloc_pd(pd), Ok(()));
    assert_eq!(t.dealloc_pd(pd), Err(MemError::InvalidPd { pd: pd.0 }));
    assert_eq!(t.pd_count(), 0);
    assert_eq!(t.mr_count(), 0);
}

#[test]
fn registration_refusals() {
    let mut t = MemoryTable::new(2);
    let pd = t.alloc_pd();
    let mut a = vec![0u8; 32];
    for bad in [RW, RA, RW | RR, RA | RR] {
        assert!(
            matches!(
                reg_iova(&mut t, pd, &mut a, 0, bad),
                Err(MemError::InvalidArgument(_))
            ),
            "{bad:?} without LOCAL_WRITE must fail"
        );
    }
    assert_eq!(
        reg_iova(&mut t, PdId(999), &mut a, 0, LW),
        Err(MemError::InvalidPd { pd: 999 })
    );
    // The region's last byte would lie past 2^64 - 1.
    assert!(matches!(
        reg_iova(&mut t, pd, &mut a, u64::MAX - 30, LW),
        Err(MemError::InvalidArgument(_))
    ));
    // SAFETY: a null grant is refused before anything is stored.
    let r = unsafe { t.register(pd, std::ptr::null_mut(), 8, 0, LW) };
    assert!(matches!(r, Err(MemError::InvalidArgument(_))));
    assert_eq!(MemError::InvalidArgument("x").errno(), 22);
    assert_eq!(MemError::Busy.errno(), 16);
    assert_eq!(t.mr_count(), 0);
    // Ignored flags are accepted.
    let k = reg_iova(
        &mut t,
        pd,
        &mut a,
        0,
        LW | AccessFlags::ON_DEMAND | AccessFlags::HUGETLB | AccessFlags::RELAXED_ORDERING,
    )
    .expect("optional flags accepted");
    assert_eq!(t.mr_count(), 1);
    t.deregister(k.lkey).expect("dereg");
}

#[test]
fn keys_are_not_sequential_and_dead_keys_stay_dead() {
    let mut t = MemoryTable::new(3);
    let pd = t.alloc_pd();
    let mut bufs: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; 16]).collect();
    let keys: Vec<u32> = bufs
        .iter_mut()
        .map(|b| reg(&mut t, pd, b, all()).lkey)
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), keys.len(), "keys unique");
    // Neither the keys nor their index parts count up.
    let steps: Vec<u32> = keys.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(
        steps.iter().all(|&s| s != 1 && s != 0x100),
        "steps {steps:x?}"
    );
    let idx_steps = keys
        .windows(2)
        .filter(|w| (w[1] >> 8).wrapping_sub(w[0] >> 8) == 1)
        .count();
    assert!(idx_steps <= 1, "index parts nearly sequential: {keys:x?}");
    assert!(steps.windows(2).any(|w| w[0] != w[1]), "constant stride");
    // Spread over the 24-bit index space, not packed near 0.
    assert!(keys.iter().any(|k| k >> 8 > 0x10_0000));
    // Another device (seed) hands out other keys.
    let mut t2 = MemoryTable::new(4);
    let pd2 = t2.alloc_pd();
    let k2 = reg(&mut t2, pd2, &mut bufs[0], all()).lkey;
    assert_ne!(k2, keys[0]);

    // Reuse a slot many times: a dead key never resolves, the new one differs from it.
    let mut dead = Vec::new();
    let mut cur = keys[5];
    for _ in 0..200 {
        t.deregister(cur).expect("dereg");
        dead.push(cur);
        let b = &mut bufs[5];
        let next = reg(&mut t, pd, b, all()).lkey;
        assert_ne!(next, cur);
        for &d in &dead {
            if d != next {
                assert!(t.query(d).is_none());
                assert!(t.check_remote(pd, d, b.as_ptr() as u64, 1, RW).is_err());
            }
        }
        cur = next;
    }
    // Garbage keys do not resolve.
    for k in [0u32, 1, 0xffff_ffff, 0x1234_5678] {
        if !keys.contains(&k) {
            assert_eq!(
                t.check_remote(pd, k, 0, 1, RR),
                Err(MemError::InvalidKey { key: k })
            );
        }
    }
}

#[test]
fn remote_refusals_leave_memory_unchanged() {
    let mut t = MemoryTable::new(5);
    let pd = t.alloc_pd();
    let other = t.alloc_pd();
    let mut mem = pattern(256);
    let mut other_mem = pattern(64);
    let base = mem.as_ptr() as u64;
    let full = reg(&mut t, pd, &mut mem[..128], all());
    let ro = reg(&mut t, pd, &mut mem[128..192], RR);
    let wo = reg(&mut t, pd, &mut mem[192..], LW | RW);
    let foreign = reg(&mut t, other, &mut other_mem, all());
    let before = mem.clone();
    let data = [0xeeu8; 16];

    let cases: Vec<(&str, Result<(), MemError>, MemError)> = vec![
        (
            "bad key",
            t.remote_write(pd, 0xdead_beef, base, &data),
            MemError::InvalidKey { key: 0xdead_beef },
        ),
        (
            "other pd",
            t.remote_write(other, full.rkey, base, &data),
            MemError::WrongPd { key: full.rkey },
        ),
        (
            "foreign key",
            t.remote_write(pd, foreign.rkey, other_mem.as_ptr() as u64, &data),
            MemError::WrongPd { key: foreign.rkey },
        ),
        (
            "no REMOTE_WRITE",
            t.remote_write(pd, ro.rkey, base + 128, &data),
            MemError::AccessDenied {
                key: ro.rkey,
                need: RW,
            },
        ),
        (
            "before start",
            t.remote_write(pd, full.rkey, base - 1, &data),
            MemError::OutOfBounds {
                key: full.rkey,
                va: base - 1,
                len: 16,
            },
        ),
        (
            "past end",
            t.remote_write(pd, full.rkey, base + 120, &data),
            MemError::OutOfBounds {
                key: full.rkey,
                va: base + 120,
                len: 16,
            },
        ),
        (
            "far past end",
            t.remote_write(pd, full.rkey, base + 1000, &data),
            MemError::OutOfBounds {
                key: full.rkey,
                va: base + 1000,
                len: 16,
            },
        ),
        (
            "overflow",
            t.remote_write(pd, full.rkey, u64::MAX - 3, &data),
            MemError::Overflow {
                va: u64::MAX - 3,
                len: 16,
            },
        ),
        (
            "atomic without REMOTE_ATOMIC",
            t.remote_atomic(pd, wo.rkey, base + 192, AtomicOp::FetchAdd { add: 1 })
                .map(|_| ()),
            MemError::AccessDenied {
                key: wo.rkey,
                need: RA,
            },
        ),
        (
            "atomic misaligned",
            t.remote_atomic(pd, full.rkey, base + 4, AtomicOp::FetchAdd { add: 1 })
                .map(|_| ()),
            MemError::Misaligned { va: base + 4 },
        ),
        (
            "atomic past end",
            t.remote_atomic(pd, full.rkey, base + 128, AtomicOp::FetchAdd { add: 1 })
                .map(|_| ()),
            MemError::OutOfBounds {
                key: full.rkey,
                va: base + 128,
                len: 8,
            },
        ),
        (
            "check_remote straddling end",
            t.check_remote(pd, full.rkey, base + 100, 29, RW),
            MemError::OutOfBounds {
                key: full.rkey,
                va: base + 100,
                len: 29,
            },
        ),
        (
            "check_remote huge len",
            t.check_remote(pd, full.rkey, base, u64::MAX, RR),
            MemError::Overflow {
                va: base,
                len: u64::MAX,
            },
        ),
    ];
    // The misaligned-atomic test needs an aligned base; Vec<u8> from the global allocator
    // of this size is 8-aligned, but say so if not.
    assert_eq!(base & 7, 0, "test buffer not 8-aligned");
    for (name, got, want) in cases {
        assert_eq!(got, Err(want), "{name}");
    }
    assert_eq!(mem, before, "refused writes changed memory");

    // Reads: missing REMOTE_READ, out of range; dst untouched on refusal.
    let mut out = [0x55u8; 8];
    assert_eq!(
        t.remote_read(pd, wo.rkey, base + 192, &mut out),
        Err(MemError::AccessDenied {
            key: wo.rkey,
            need: RR
        })
    );
    assert_eq!(
        t.remote_read(pd, ro.rkey, base + 190, &mut out),
        Err(MemError::OutOfBounds {
            key: ro.rkey,
            va: base + 190,
            len: 8
        })
    );
    assert_eq!(out, [0x55; 8]);
    // An lkey of a local-only region is not an rkey.
    let local = reg(&mut t, pd, &mut other_mem[..8], LW);
    assert_eq!(
        t.remote_read(pd, local.lkey, other_mem.as_ptr() as u64, &mut out),
        Err(MemError::InvalidKey { key: local.lkey })
    );

    // And the allowed accesses do work.
    t.remote_write(pd, full.rkey, base + 112, &data)
        .expect("write at end");
    assert_eq!(&mem[112..128], &data);
    t.remote_read(pd, ro.rkey, base + 184, &mut out)
        .expect("read at end");
    assert_eq!(&out[..], &before[184..192]);
    assert_eq!(&mem[128..], &before[128..]);
    assert_eq!(&mem[..112], &before[..112]);
}

#[test]
fn iova_near_the_top_of_the_address_space() {
    let mut t = MemoryTable::new(6);
    let pd = t.alloc_pd();
    let mut words: Box<[u64]> = vec![7u64, 9].into_boxed_slice();
    let iova = u64::MAX - 15; // the region's last byte is u64::MAX
                              // SAFETY: `words` outlives the table's use of it.
    let k = unsafe { t.register(pd, words.as_mut_ptr().cast(), 16, iova, all()) }.expect("reg");
    // va + len overflows u64: refused as Overflow, memory intact.
    assert_eq!(
        t.remote_write(pd, k.rkey, u64::MAX - 3, &[1; 8]),
        Err(MemError::Overflow {
            va: u64::MAX - 3,
            len: 8
        })
    );
    assert_eq!(
        t.check_remote(pd, k.rkey, u64::MAX - 3, 8, RR),
        Err(MemError::Overflow {
            va: u64::MAX - 3,
            len: 8
        })
    );
    let mut out = [0u8; 8];
    assert_eq!(
        t.remote_read(pd, k.rkey, u64::MAX - 3, &mut out),
        Err(MemError::Overflow {
            va: u64::MAX - 3,
            len: 8
        })
    );
    assert_eq!(&words[..], &[7, 9]);
    // An access ending exactly at 2^64 is inside the region and allowed.
    assert_eq!(
        t.remote_atomic(pd, k.rkey, u64::MAX - 7, AtomicOp::FetchAdd { add: 1 }),
        Ok(9)
    );
    assert_eq!(&words[..], &[7, 10]);
    t.remote_write(pd, k.rkey, u64::MAX - 15, &5u64.to_ne_bytes())
        .expect("write first word");
    assert_eq!(&words[..], &[5, 10]);
    // Below the iova.
    assert_eq!(
        t.check_remote(pd, k.rkey, iova - 1, 1, RR),
        Err(MemError::OutOfBounds {
            key: k.rkey,
            va: iova - 1,
            len: 1
        })
    );
    t.deregister(k.lkey).expect("dereg");
}

#[test]
fn zero_based_and_chosen_iova() {
    let mut t = MemoryTable::new(7);
    let pd = t.alloc_pd();
    let mut a = pattern(32);
    // ZERO_BASED ignores the iova argument.
    let k = reg_iova(&mut t, pd, &mut a, 0x5555, all() | AccessFlags::ZERO_BASED).expect("reg");
    assert_eq!(t.query(k.lkey).map(|i| i.iova), Some(0));
    t.remote_write(pd, k.rkey, 4, &[0xaa; 4])
        .expect("write at iova 4");
    assert_eq!(&a[4..8], &[0xaa; 4]);
    let mut b = pattern(32);
    let kb = reg_iova(&mut t, pd, &mut b, 0x1000_0000, all()).expect("reg");
    let mut out = [0u8; 2];
    t.remote_read(pd, kb.rkey, 0x1000_001e, &mut out)
        .expect("read");
    assert_eq!(out, [pattern(32)[30], pattern(32)[31]]);
    // The host address means nothing in iova space.
    assert!(matches!(
        t.remote_read(pd, kb.rkey, b.as_ptr() as u64, &mut out),
        Err(MemError::OutOfBounds { .. })
    ));
}

#[test]
fn zero_length_remote_access_skips_the_key() {
    let t = MemoryTable::new(8);
    // rxe: a zero-byte RDMA WRITE / READ is not required to carry a valid addr or rkey.
    assert_eq!(t.check_remote(PdId(1), 0xbad, u64::MAX, 0, RW), Ok(()));
    assert_eq!(t.remote_write(PdId(1), 0xbad, 0, &[]), Ok(()));
    assert_eq!(t.remote_read(PdId(1), 0xbad, 0, &mut []), Ok(()));
    // ... but an atomic is always 8 bytes and always checked.
    assert_eq!(
        t.remote_atomic(PdId(1), 0xbad, 0, AtomicOp::FetchAdd { add: 1 }),
        Err(MemError::InvalidKey { key: 0xbad })
    );
}

#[test]
fn atomics() {
    let mut t = MemoryTable::new(9);
    let pd = t.alloc_pd();
    let mut words: Box<[u64]> = vec![10, u64::MAX - 1, 0x1122_3344_5566_7788].into_boxed_slice();
    let p = words.as_mut_ptr();
    let va = p as u64;
    // SAFETY: `words` outlives the table's use of it.
    let k = unsafe { t.register(pd, p.cast(), 24, va, all()) }.expect("reg");
    // Compare-swap, success: returns the old value, stores the new one.
    let cs = AtomicOp::CompareSwap {
        compare: 10,
        swap: 42,
    };
    assert_eq!(t.remote_atomic(pd, k.rkey, va, cs), Ok(10));
    assert_eq!(words[0], 42);
    // Failure: returns the current value, memory unchanged.
    assert_eq!(t.remote_atomic(pd, k.rkey, va, cs), Ok(42));
    assert_eq!(words[0], 42);
    // Fetch-add wraps modulo 2^64.
    assert_eq!(
        t.remote_atomic(pd, k.rkey, va + 8, AtomicOp::FetchAdd { add: 3 }),
        Ok(u64::MAX - 1)
    );
    assert_eq!(words[1], 1);
    // Host byte order: the word is the native u64.
    let mut raw = [0u8; 8];
    t.remote_read(pd, k.rkey, va + 16, &mut raw).expect("read");
    assert_eq!(u64::from_ne_bytes(raw), 0x1122_3344_5566_7788);
    // A va that is aligned while the host word is not (hand-picked iova): refused.
    let mut bytes = vec![0u8; 32];
    let host = bytes.as_mut_ptr() as u64;
    let shift = if host & 7 == 0 { 1 } else { 0 };
    let kb = reg_iova(&mut t, pd, &mut bytes[shift..shift + 16], 0x1000, all()).expect("reg");
    assert_eq!(
        t.remote_atomic(pd, kb.rkey, 0x1000, AtomicOp::FetchAdd { add: 1 }),
        Err(MemError::Misaligned { va: 0x1000 })
    );
    assert!(bytes.iter().all(|&b| b == 0));
    assert!(MemError::Misaligned { va: 0 }.is_invalid_request());
}

#[test]
fn concurrent_fetch_add_is_atomic() {
    let mut t = MemoryTable::new(10);
    let pd = t.alloc_pd();
    let mut word: Box<[u64]> = vec![0].into_boxed_slice();
    let va = word.as_mut_ptr() as u64;
    // SAFETY: `word` outlives the threads below.
    let k = unsafe { t.register(pd, word.as_mut_ptr().cast(), 8, va, all()) }.expect("reg");
    let t = &t;
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(move || {
                for _ in 0..5000 {
                    t.remote_atomic(pd, k.rkey, va, AtomicOp::FetchAdd { add: 1 })
                        .expect("fa");
                }
            });
        }
    });
    assert_eq!(word[0], 10_000);
}

#[test]
fn gather_scatter_across_sges() {
    let mut t = MemoryTable::new(11);
    let pd = t.alloc_pd();
    let mut a = pattern(100);
    let mut b = vec![0u8; 50];
    let ka = reg(&mut t, pd, &mut a, LW);
    let kb = reg(&mut t, pd, &mut b, LW);
    let (pa, pb) = (a.as_ptr() as u64, b.as_ptr() as u64);
    let sges = [
        Sge {
            addr: pa + 10,
            length: 5,
            lkey: ka.lkey,
        },
        Sge {
            addr: 0,
            length: 0,
            lkey: 0xdead,
        }, // empty: skipped unread, as rxe
        Sge {
            addr: pb + 20,
            length: 7,
            lkey: kb.lkey,
        },
        Sge {
            addr: pa + 90,
            length: 10,
            lkey: ka.lkey,
        },
    ];
    assert_eq!(MemoryTable::sge_total_len(&sges), Ok(22));
    assert_eq!(t.validate_sges(pd, &sges, true), Ok(()));
    // Scatter 9 bytes starting 3 bytes in: 2 into a[13..15], 7 into b[20..27].
    t.scatter(pd, &sges, 3, &[1, 2, 3, 4, 5, 6, 7, 8, 9])
        .expect("scatter");
    assert_eq!(&a[13..15], &[1, 2]);
    assert_eq!(&b[20..27], &[3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(&a[10..13], &pattern(100)[10..13]);
    // Gather it back, crossing into the last SGE.
    let mut out = [0u8; 12];
    t.gather(pd, &sges, 3, &mut out).expect("gather");
    assert_eq!(&out[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(&out[9..], &pattern(100)[90..93]);
    // Too long: LocalLength with the numbers, memory unchanged.
    let before = (a.clone(), b.clone());
    assert_eq!(
        t.scatter(pd, &sges, 20, &[0xff; 3]),
        Err(MemError::LocalLength {
            needed: 23,
            available: 22
        })
    );
    assert!(MemError::LocalLength {
        needed: 1,
        available: 0
    }
    .is_length_error());
    let mut big = [0u8; 23];
    assert_eq!(
        t.gather(pd, &sges, 0, &mut big),
        Err(MemError::LocalLength {
            needed: 23,
            available: 22
        })
    );
    assert_eq!((a.clone(), b.clone()), before);
}

#[test]
fn local_refusals() {
    let mut t = MemoryTable::new(12);
    let pd = t.alloc_pd();
    let other = t.alloc_pd();
    let mut a = pattern(64);
    let mut r = pattern(64);
    let ka = reg(&mut t, pd, &mut a, LW);
    let kr = reg(&mut t, pd, &mut r, AccessFlags::empty()); // local read only
    let (pa, pr) = (a.as_ptr() as u64, r.as_ptr() as u64);
    let before = (a.clone(), r.clone());
    let ok = Sge {
        addr: pa,
        length: 8,
        lkey: ka.lkey,
    };

    // Second SGE bad: nothing written, not even the first SGE's bytes.
    let bad_cases = [
        (
            Sge {
                addr: pr,
                length: 8,
                lkey: kr.lkey,
            },
            MemError::AccessDenied {
                key: kr.lkey,
                need: LW,
            },
        ),
        (
            Sge {
                addr: pa,
                length: 8,
                lkey: 0x4242_4242,
            },
            MemError::InvalidKey { key: 0x4242_4242 },
        ),
        (
            Sge {
                addr: pa + 60,
                length: 8,
                lkey: ka.lkey,
            },
            MemError::OutOfBounds {
                key: ka.lkey,
                va: pa + 60,
                len: 8,
            },
        ),
        (
            Sge {
                addr: pa - 8,
                length: 8,
                lkey: ka.lkey,
            },
            MemError::OutOfBounds {
                key: ka.lkey,
                va: pa - 8,
                len: 8,
            },
        ),
        (
            Sge {
                addr: u64::MAX - 3,
                length: 8,
                lkey: ka.lkey,
            },
            MemError::Overflow {
                va: u64::MAX - 3,
                len: 8,
            },
        ),
    ];
    for (bad, want) in bad_cases {
        let sges = [ok, bad];
        assert_eq!(t.scatter(pd, &sges, 0, &[0xee; 16]), Err(want), "{bad:?}");
        assert_eq!(t.validate_sges(pd, &sges, true), Err(want));
        assert_eq!((a.clone(), r.clone()), before);
    }
    // Other PD.
    assert_eq!(
        t.scatter(other, &[ok], 0, &[1; 8]),
        Err(MemError::WrongPd { key: ka.lkey })
    );
    let mut out = [0u8; 8];
    assert_eq!(
        t.gather(other, &[ok], 0, &mut out),
        Err(MemError::WrongPd { key: ka.lkey })
    );
    // Read-only region: gather works (no right needed), validate without write works.
    let ro = Sge {
        addr: pr + 8,
        length: 8,
        lkey: kr.lkey,
    };
    t.gather(pd, &[ro], 0, &mut out).expect("gather read-only");
    assert_eq!(&out, &before.1[8..16]);
    assert_eq!(t.validate_sges(pd, &[ro], false), Ok(()));
    // validate_sges checks the whole SGE; gather only the bytes it touches (rxe).
    let long = Sge {
        addr: pa + 60,
        length: 8,
        lkey: ka.lkey,
    };
    assert!(t.validate_sges(pd, &[long], false).is_err());
    t.gather(pd, &[long], 0, &mut out[..4])
        .expect("touches only a[60..64]");
    assert_eq!(&out[..4], &before.0[60..64]);
    assert_eq!((a.clone(), r.clone()), before);
}

#[test]
fn rereg_changes_rights_pd_and_translation() {
    let mut t = MemoryTable::new(13);
    let pd = t.alloc_pd();
    let pd2 = t.alloc_pd();
    let mut a = pattern(32);
    let mut b = vec![0u8; 16];
    let k = reg(&mut t, pd, &mut a, LW);
    assert_eq!(k.rkey, 0);
    let pa = a.as_ptr() as u64;
    // SAFETY: `a` stays valid and writable.
    let k2 = unsafe {
        t.rereg(
            k.lkey,
            Rereg {
                access: Some(LW | RW),
                ..Rereg::default()
            },
        )
    }
    .expect("rereg access");
    assert_eq!(
        k2,
        MrKeys {
            lkey: k.lkey,
            rkey: k.lkey
        }
    );
    t.remote_write(pd, k2.rkey, pa, &[0xab])
        .expect("now writable");
    assert_eq!(a[0], 0xab);
    // Invalid change: nothing changes.
    // SAFETY: refused before anything changes.
    let r = unsafe {
        t.rereg(
            k.lkey,
            Rereg {
                access: Some(RW),
                ..Rereg::default()
            },
        )
    };
    assert!(matches!(r, Err(MemError::InvalidArgument(_))));
    assert_eq!(t.query(k.lkey).map(|i| i.access), Some(LW | RW));
    // Move to pd2.
    // SAFETY: same memory and rights.
    unsafe {
        t.rereg(
            k.lkey,
            Rereg {
                pd: Some(pd2),
                ..Rereg::default()
            },
        )
    }
    .expect("pd");
    assert_eq!(t.pd_mr_count(pd), 0);
    assert_eq!(t.pd_mr_count(pd2), 1);
    assert_eq!(
        t.remote_write(pd, k2.rkey, pa, &[1]),
        Err(MemError::WrongPd { key: k2.rkey })
    );
    // New translation.
    let tr = Translation {
        addr: b.as_mut_ptr(),
        len: b.len(),
        iova: 0x9000,
    };
    // SAFETY: `b` stays valid and writable.
    unsafe {
        t.rereg(
            k.lkey,
            Rereg {
                translation: Some(tr),
                ..Rereg::default()
            },
        )
    }
    .expect("tr");
    t.remote_write(pd2, k2.rkey, 0x9000 + 15, &[7])
        .expect("write new translation");
    assert_eq!(b[15], 7);
    assert!(t.remote_write(pd2, k2.rkey, pa, &[7]).is_err());
    assert_eq!(a[1..], pattern(32)[1..]);
    assert_eq!(t.dealloc_pd(pd), Ok(()));
}

#[test]
fn pd_holders_keep_it_busy() {
    let mut t = MemoryTable::new(14);
    let pd = t.alloc_pd();
    assert_ne!(pd, t.alloc_pd());
    t.hold_pd(pd).expect("hold");
    assert_eq!(t.dealloc_pd(pd), Err(MemError::Busy));
    t.release_pd(pd).expect("release");
    assert!(t.release_pd(pd).is_err());
    assert_eq!(t.dealloc_pd(pd), Ok(()));
    assert!(!t.pd_exists(pd));
    assert_eq!(t.hold_pd(pd), Err(MemError::InvalidPd { pd: pd.0 }));
}

/// `warm` covers the scatter list's first bytes, as far as its SGEs check out (it only
/// prefetches: the bytes stay as they are), and ends quietly at a bad key, another PD's
/// region or a range past the region.
#[test]
fn warm_covers_what_checks_out() {
    let mut t = MemoryTable::new(1);
    let pd = t.alloc_pd();
    let other = t.alloc_pd();
    let mut a = pattern(8192);
    let mut b = pattern(4096);
    let ka = reg(&mut t, pd, &mut a, LW);
    let kb = reg(&mut t, pd, &mut b, LW);
    let sge = |buf: &[u8], k: &MrKeys, off: usize, len: u32| Sge {
        addr: buf.as_ptr() as u64 + off as u64,
        length: len,
        lkey: k.lkey,
    };
    let two = [sge(&a, &ka, 0, 8192), sge(&b, &kb, 0, 4096)];
    assert_eq!(t.warm(pd, &two, 100_000), 12_288);
    assert_eq!(t.warm(pd, &two, 10_000), 10_000);
    assert_eq!(t.warm(pd, &two, 0), 0);
    assert_eq!(t.warm(other, &two, 10_000), 0, "another PD's region");
    let bad = [
        sge(&a, &ka, 0, 4096),
        Sge {
            lkey: kb.lkey ^ 0x100,
            ..two[1]
        },
    ];
    assert_eq!(t.warm(pd, &bad, 10_000), 4096, "stops at the bad key");
    let empty_first = [sge(&a, &ka, 0, 0), two[1]];
    assert_eq!(
        t.warm(pd, &empty_first, 10_000),
        4096,
        "an empty SGE is skipped"
    );
    let past = [sge(&a, &ka, 4096, 8192)];
    assert_eq!(t.warm(pd, &past, 10_000), 0, "past the region's end");
    assert_eq!(a, pattern(8192));
    assert_eq!(b, pattern(4096));
}
