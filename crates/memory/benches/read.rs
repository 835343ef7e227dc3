//! Regression guard for the RDMA READ responder's copy out of registered memory: the plain
//! copy, the copy followed by a separate CRC (what the seal did before `remote_read_crc`),
//! the CRC alone (crc32fast: the floor for any ICRC on this CPU, which the fused path
//! should approach), and the fused copy + CRC; and the receive side's copy into memory
//! beyond the caches (a deep receive queue's buffers).
//!
//! Run: `cargo bench -p softhca-memory` (add `-- --quick` for a short check).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softhca_memory::{AccessFlags, MemoryTable, MrKeys, PdId};

/// One packet's payload at the 1024 and 4096 path MTUs, and a whole 64 KiB message.
const SIZES: [usize; 3] = [1024, 4096, 65536];

/// A table with `region` registered in a new PD with LOCAL_WRITE and `remote`; the
/// region comes back with the table to be dropped after it.
fn registered(
    mut region: Vec<u8>,
    remote: AccessFlags,
) -> (MemoryTable, PdId, Vec<u8>, u64, MrKeys) {
    let mut t = MemoryTable::new(1);
    let pd = t.alloc_pd();
    let va = region.as_mut_ptr() as u64;
    // SAFETY: the region's heap buffer outlives the table (the caller drops the table
    // first) and is not moved or freed meanwhile (moving the Vec does not move it).
    let keys = unsafe {
        t.register(
            pd,
            region.as_mut_ptr(),
            region.len(),
            va,
            AccessFlags::LOCAL_WRITE | remote,
        )
    }
    .expect("register");
    (t, pd, region, va, keys)
}

fn bench_remote_read(c: &mut Criterion) {
    let mut g = c.benchmark_group("remote_read");
    let region: Vec<u8> = (0..(1usize << 20))
        .map(|i| (i as u8).wrapping_mul(29))
        .collect();
    let (t, pd, region, va, keys) = registered(region, AccessFlags::REMOTE_READ);
    for size in SIZES {
        let mut dst = vec![0u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(BenchmarkId::new("copy", size), |b| {
            b.iter(|| t.remote_read(pd, keys.rkey, black_box(va), &mut dst))
        });
        g.bench_function(BenchmarkId::new("copy_then_crc32fast", size), |b| {
            b.iter(|| {
                t.remote_read(pd, keys.rkey, black_box(va), &mut dst).ok()?;
                Some(crc32fast::hash(&dst))
            })
        });
        g.bench_function(BenchmarkId::new("crc32fast_only", size), |b| {
            b.iter(|| crc32fast::hash(black_box(&dst)))
        });
        g.bench_function(BenchmarkId::new("fused_copy_crc", size), |b| {
            b.iter(|| t.remote_read_crc(pd, keys.rkey, black_box(va), &mut dst))
        });
    }
    g.finish();
    drop(t);
    drop(region);
}

/// The receive side: a 4 KiB packet's payload (warm, as the socket left it) placed by
/// an RDMA WRITE into a registered region far beyond the caches, as a deep receive
/// queue's buffers are (UCX posts thousands).
fn bench_receive_cold(c: &mut Criterion) {
    const PKT: usize = 4096;
    const SPAN: usize = 256 << 20;
    let mut g = c.benchmark_group("receive_cold");
    let src: Vec<u8> = (0..PKT).map(|i| (i as u8).wrapping_mul(31)).collect();
    let (t, pd, region, va, keys) = registered(vec![0u8; SPAN], AccessFlags::REMOTE_WRITE);
    g.throughput(Throughput::Bytes(PKT as u64));
    let mut at = 0;
    let mut next = move || {
        at = (at + PKT + 64) % (SPAN - PKT);
        at as u64
    };
    g.bench_function("remote_write", |b| {
        b.iter(|| t.remote_write(pd, keys.rkey, va + next(), black_box(&src)))
    });
    g.finish();
    drop(t);
    drop(region);
}

criterion_group!(benches, bench_remote_read, bench_receive_cold);
criterion_main!(benches);
