//! Memory windows: binding, remote access through a window's rkey within its bounds and
//! rights, type 2 windows answering only their QP, invalidation, and every refusal rxe
//! makes (`rxe_check_bind_mw`, `rxe_invalidate_mw`, `rxe_lookup_mw`).

use softhca_memory::{AccessFlags, MemError, MemoryTable, MwBind, MwType, PdId};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const RW: AccessFlags = AccessFlags::REMOTE_WRITE;
const RR: AccessFlags = AccessFlags::REMOTE_READ;
const BIND: AccessFlags = AccessFlags::MW_BIND;

struct Fixture {
    t: MemoryTable,
    pd: PdId,
    base: u64,
    lkey: u32,
    _buf: Vec<u8>,
}

fn fixture(access: AccessFlags) -> Fixture {
    let mut t = MemoryTable::new(9);
    let pd = t.alloc_pd();
    let mut buf = vec![0u8; 4096];
    let addr = buf.as_mut_ptr();
    // SAFETY: `buf` lives in the fixture, unborrowed, as long as the table.
    let keys = unsafe { t.register(pd, addr, buf.len(), addr as u64, access) }.unwrap();
    Fixture {
        t,
        pd,
        base: addr as u64,
        lkey: keys.lkey,
        _buf: buf,
    }
}

fn bind(f: &Fixture, mw: u32, off: u64, len: u64, access: AccessFlags) -> MwBind {
    MwBind {
        mw_rkey: mw,
        key_byte: (mw as u8).wrapping_add(1),
        mr_lkey: f.lkey,
        addr: f.base + off,
        len,
        access,
    }
}

#[test]
fn type1_window_grants_its_range_and_rights_only() {
    let mut f = fixture(LW | BIND);
    let mw = f.t.alloc_mw(f.pd, MwType::Type1).unwrap();
    // Unbound: nothing resolves.
    assert!(f.t.remote_write(f.pd, mw, f.base, &[1]).is_err());
    let b = bind(&f, mw, 1024, 512, RW);
    let rkey = f.t.bind_mw(f.pd, 7, b).unwrap();
    assert_eq!(rkey >> 8, mw >> 8);
    assert_eq!(rkey & 0xff, u32::from(b.key_byte));
    f.t.remote_write(f.pd, rkey, f.base + 1024, &[5; 512])
        .unwrap();
    let mut back = [0u8; 512];
    // No REMOTE_READ on the window, though the data is there.
    assert!(f
        .t
        .remote_read(f.pd, rkey, f.base + 1024, &mut back)
        .is_err());
    // Outside the window, inside the region.
    assert!(matches!(
        f.t.remote_write(f.pd, rkey, f.base + 1023, &[1]),
        Err(MemError::OutOfBounds { .. })
    ));
    assert!(f.t.remote_write(f.pd, rkey, f.base + 1536, &[1]).is_err());
    // The old rkey no longer resolves; another PD is refused.
    assert!(f.t.remote_write(f.pd, mw, f.base + 1024, &[1]).is_err());
    let other = f.t.alloc_pd();
    assert!(f.t.remote_write(other, rkey, f.base + 1024, &[1]).is_err());
    // The region cannot go while the window is bound; a zero-length bind unbinds.
    assert!(f.t.deregister(f.lkey).is_err());
    let unbind = MwBind {
        len: 0,
        mr_lkey: 0,
        ..bind(&f, rkey, 0, 0, RW)
    };
    let r2 = f.t.bind_mw(f.pd, 7, unbind).unwrap();
    assert!(f.t.remote_write(f.pd, r2, f.base + 1024, &[1]).is_err());
    // Type 1 windows cannot be invalidated.
    assert!(f.t.invalidate(r2).is_err());
    f.t.dealloc_mw(r2).unwrap();
    f.t.deregister(f.lkey).unwrap();
}

#[test]
fn type2_window_answers_its_qp_until_invalidated() {
    let mut f = fixture(LW | BIND);
    let mw = f.t.alloc_mw(f.pd, MwType::Type2).unwrap();
    assert!(f
        .t
        .bind_mw(
            f.pd,
            3,
            MwBind {
                len: 0,
                ..bind(&f, mw, 0, 0, RR)
            }
        )
        .is_err());
    let rkey =
        f.t.bind_mw(f.pd, 3, bind(&f, mw, 0, 4096, RR | RW))
            .unwrap();
    f.t.remote_write((f.pd, 3), rkey, f.base, &[9; 16]).unwrap();
    let mut back = [0u8; 16];
    f.t.remote_read((f.pd, 3), rkey, f.base, &mut back).unwrap();
    assert_eq!(back, [9; 16]);
    // Another QP of the same PD is refused.
    assert!(f.t.remote_read((f.pd, 4), rkey, f.base, &mut back).is_err());
    // A bound type 2 window must be invalidated before it is bound again.
    assert!(f.t.bind_mw(f.pd, 3, bind(&f, rkey, 0, 16, RR)).is_err());
    f.t.invalidate(rkey).unwrap();
    assert!(f.t.remote_read((f.pd, 3), rkey, f.base, &mut back).is_err());
    assert!(f.t.invalidate(rkey).is_err());
    let r3 = f.t.bind_mw(f.pd, 3, bind(&f, rkey, 8, 8, RR)).unwrap();
    f.t.remote_read((f.pd, 3), r3, f.base + 8, &mut back[..8])
        .unwrap();
    f.t.dealloc_mw(r3).unwrap();
    f.t.deregister(f.lkey).unwrap();
}

#[test]
fn bind_refusals() {
    // The region lacks MW_BIND.
    let mut f = fixture(LW | RW);
    let mw = f.t.alloc_mw(f.pd, MwType::Type1).unwrap();
    assert!(f.t.bind_mw(f.pd, 1, bind(&f, mw, 0, 64, RR)).is_err());
    // Remote write through a window needs a locally writable region.
    let mut f = fixture(BIND | RR);
    let mw = f.t.alloc_mw(f.pd, MwType::Type1).unwrap();
    assert!(f.t.bind_mw(f.pd, 1, bind(&f, mw, 0, 64, RW)).is_err());
    f.t.bind_mw(f.pd, 1, bind(&f, mw, 0, 64, RR)).unwrap();
    // Beyond the region; local rights in a window; a type 2 window of another PD.
    let mut f = fixture(LW | BIND);
    let mw = f.t.alloc_mw(f.pd, MwType::Type1).unwrap();
    assert!(f.t.bind_mw(f.pd, 1, bind(&f, mw, 4000, 200, RR)).is_err());
    assert!(f.t.bind_mw(f.pd, 1, bind(&f, mw, 0, 64, LW)).is_err());
    let other = f.t.alloc_pd();
    let mw2 = f.t.alloc_mw(f.pd, MwType::Type2).unwrap();
    assert!(f.t.bind_mw(other, 1, bind(&f, mw2, 0, 64, RR)).is_err());
    // Regions registered with ibv_reg_mr cannot be invalidated.
    assert!(f.t.invalidate(f.lkey).is_err());
}
