//! gather / scatter against a reference model built on plain `Vec<u8>`s.

use proptest::prelude::*;
use softhca_memory::{AccessFlags, MemError, MemoryTable, PdId, Sge};

const LENS: [usize; 3] = [64, 48, 32];
const IOVA: [u64; 3] = [0x1000, 0x2000, 0x3000];
/// Region 2 is registered read-only (no LOCAL_WRITE).
const WRITABLE: [bool; 3] = [true, true, false];
const BAD_KEY: u32 = 0x00ba_d001;

#[derive(Debug, Clone)]
struct SgeSpec {
    region: usize, // 3 = a key that names nothing
    start: i64,    // offset from the region's iova, may fall outside
    length: u32,
}

fn sge_spec() -> impl Strategy<Value = SgeSpec> {
    // Mostly SGEs inside their region (so that many lists succeed), some anywhere.
    let region = prop_oneof![3 => Just(0usize), 3 => Just(1usize), 1 => Just(2usize)];
    let inside = (
        region,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(region, a, b)| {
            let start = a.index(LENS[region]);
            let length = b.index(LENS[region] - start + 1) as u32;
            SgeSpec {
                region,
                start: start as i64,
                length,
            }
        });
    let anywhere = (0usize..4, -4i64..72, 0u32..40).prop_map(|(region, start, length)| SgeSpec {
        region,
        start,
        length,
    });
    prop_oneof![6 => inside, 1 => anywhere]
}

struct Fixture {
    table: MemoryTable,
    pd: PdId,
    bufs: Vec<Vec<u8>>,
    keys: Vec<u32>,
}

fn fixture(seed: u64) -> Fixture {
    let mut table = MemoryTable::new(seed);
    let pd = table.alloc_pd();
    let mut bufs: Vec<Vec<u8>> = LENS
        .iter()
        .enumerate()
        .map(|(r, &n)| (0..n).map(|i| (r * 100 + i) as u8).collect())
        .collect();
    let keys = bufs
        .iter_mut()
        .enumerate()
        .map(|(r, b)| {
            let access = if WRITABLE[r] {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::empty()
            };
            // SAFETY: the buffers live in the fixture, never reallocated, until it drops.
            unsafe { table.register(pd, b.as_mut_ptr(), b.len(), IOVA[r], access) }
                .expect("register")
                .lkey
        })
        .collect();
    Fixture {
        table,
        pd,
        bufs,
        keys,
    }
}

fn to_sges(f: &Fixture, specs: &[SgeSpec]) -> Vec<Sge> {
    specs
        .iter()
        .map(|s| {
            let (iova, lkey) = if s.region < 3 {
                (IOVA[s.region], f.keys[s.region])
            } else {
                (0x4000, BAD_KEY)
            };
            Sge {
                addr: (iova as i64 + s.start) as u64,
                length: s.length,
                lkey,
            }
        })
        .collect()
}

fn total(specs: &[SgeSpec]) -> usize {
    specs.iter().map(|s| s.length as usize).sum()
}

/// The reference: map each data byte to (region, index) or say which error comes first.
fn model_map(
    specs: &[SgeSpec],
    sges: &[Sge],
    offset: usize,
    len: usize,
    write: bool,
) -> Result<Vec<(usize, usize)>, MemError> {
    let total: u64 = specs.iter().map(|s| u64::from(s.length)).sum();
    if len == 0 {
        return Ok(Vec::new());
    }
    if (offset + len) as u64 > total {
        return Err(MemError::LocalLength {
            needed: (offset + len) as u64,
            available: total,
        });
    }
    // Expand the concatenation byte by byte, then cut it into per-SGE pieces.
    let mut map = Vec::new();
    let mut pos = 0usize;
    for (spec, sge) in specs.iter().zip(sges) {
        let lo = pos.max(offset);
        let hi = (pos + spec.length as usize).min(offset + len);
        if lo < hi {
            let skip = (lo - pos) as i64;
            let n = hi - lo;
            let va = sge.addr + skip as u64;
            if spec.region == 3 {
                return Err(MemError::InvalidKey { key: BAD_KEY });
            }
            if write && !WRITABLE[spec.region] {
                return Err(MemError::AccessDenied {
                    key: sge.lkey,
                    need: AccessFlags::LOCAL_WRITE,
                });
            }
            let first = spec.start + skip;
            if first < 0 || first as usize + n > LENS[spec.region] {
                return Err(MemError::OutOfBounds {
                    key: sge.lkey,
                    va,
                    len: n as u64,
                });
            }
            map.extend((0..n).map(|i| (spec.region, first as usize + i)));
        }
        pos += spec.length as usize;
    }
    Ok(map)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn scatter_matches_model(specs in prop::collection::vec(sge_spec(), 0..6), at in any::<prop::sample::Index>(),
                             data in prop::collection::vec(any::<u8>(), 0..64), seed in any::<u64>()) {
        let f = fixture(seed);
        let offset = at.index(total(&specs) + 8);
        let sges = to_sges(&f, &specs);
        let mut model = f.bufs.clone();
        let expected = model_map(&specs, &sges, offset, data.len(), true);
        let got = f.table.scatter(f.pd, &sges, offset, &data);
        match expected {
            Ok(map) => {
                prop_assert_eq!(got, Ok(()));
                for (i, (r, at)) in map.into_iter().enumerate() {
                    model[r][at] = data[i];
                }
            }
            Err(e) => prop_assert_eq!(got, Err(e)),
        }
        // Refused or not, memory equals the model (untouched on refusal).
        prop_assert_eq!(&f.bufs, &model);
    }

    #[test]
    fn gather_matches_model(specs in prop::collection::vec(sge_spec(), 0..6), at in any::<prop::sample::Index>(),
                            n in any::<prop::sample::Index>(), seed in any::<u64>()) {
        let f = fixture(seed);
        let offset = at.index(total(&specs) + 8);
        let len = n.index((total(&specs) + 8).saturating_sub(offset) + 1);
        let sges = to_sges(&f, &specs);
        let model = f.bufs.clone();
        let mut out = vec![0u8; len];
        let got = f.table.gather(f.pd, &sges, offset, &mut out);
        match model_map(&specs, &sges, offset, len, false) {
            Ok(map) => {
                prop_assert_eq!(got, Ok(()));
                let want: Vec<u8> = map.into_iter().map(|(r, at)| model[r][at]).collect();
                prop_assert_eq!(out, want);
            }
            Err(e) => prop_assert_eq!(got, Err(e)),
        }
        prop_assert_eq!(&f.bufs, &model);
    }
}
