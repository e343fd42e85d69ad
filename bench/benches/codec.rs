//! The iWARP codec's cost per FPDU, and CRC32c beside memcpy on this machine.
//!
//! - `fpdu_roundtrip/{64,4096}`: encode a Send segment's header and trailer (CRC32c on), then
//!   deframe, check the CRC and decode it: what one FPDU costs both ends, minus the socket.
//! - `crc32c_vs_memcpy/{256,512,2048,4096,65536}`: CRC32c over a buffer as the provider computes
//!   it (`crc32c_append`, folding with carry-less multiplies from 512 bytes where the CPU can),
//!   the `crc32c` crate's own code beside it, and copying the buffer: what the soft provider pays
//!   per byte when CRC is negotiated on. The copy's two buffers start on page boundaries: where
//!   the destination lies 1 to 63 bytes after the source modulo 4 KiB, as two heap vectors may,
//!   glibc's `memcpy` crawls on some CPUs (bench/RESULTS.md, fifty-fourth session). Then the
//!   provider's two copies with CRC (a received payload into its region, a Read Response's
//!   snapshot): `memcpy_then_crc32c`, the copy and then the CRC of the copy, as they were made
//!   before the fifty-seventh session, and `crc32c_copy`, both in one pass, as they are now.
//! - `stream_hop/write_8`: one 8-byte RDMA Write through two sans-I/O streams, as `write_lat`
//!   moves it minus the sockets and the engine: posted on one (unsignaled), its bytes copied out
//!   as one small send and counted sent, then fed to the other, which checks the key and places
//!   the 8 bytes. The user-space part of a soft hop that the stream owns (bench/RESULTS.md,
//!   fifty-second session: `post_send` → enter and `rx_feed`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

use barewire_soft_rdma::wire::*;

fn fpdu_roundtrip(c: &mut Criterion) {
    let mut g = c.benchmark_group("fpdu_roundtrip");
    for size in [64usize, 4096] {
        let payload = vec![0xa5u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &payload, |b, payload| {
            let mut wire = Vec::with_capacity(size + 32);
            b.iter(|| {
                let seg = Segment {
                    last: true,
                    opcode: RdmapOpcode::Send,
                    header: DdpHeader::Untagged {
                        ulp: 0,
                        qn: 0,
                        msn: 1,
                        mo: 0,
                    },
                    payload,
                };
                let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
                let n = seg.encode_header(&mut hdr).unwrap();
                let ulpdu_len = n + payload.len();
                let mut len = [0u8; FPDU_HEADER_LEN];
                encode_fpdu_header(ulpdu_len, &mut len).unwrap();
                let mut tr = [0u8; 8];
                let t = fpdu_trailer(&[&len, &hdr[..n], payload], ulpdu_len, true, &mut tr);
                // The socket would gather these three pieces; the bench lays them out once.
                wire.clear();
                wire.extend_from_slice(&len);
                wire.extend_from_slice(&hdr[..n]);
                wire.extend_from_slice(payload);
                wire.extend_from_slice(&tr[..t]);
                let (f, _) = Fpdu::decode(black_box(&wire), true, 65535)
                    .unwrap()
                    .unwrap();
                black_box(Segment::decode(f.ulpdu).unwrap());
            })
        });
    }
    g.finish();
}

/// `v` from its first page boundary on.
fn page_aligned(v: &mut [u8]) -> &mut [u8] {
    let skip = v.as_ptr().align_offset(4096);
    &mut v[skip..]
}

fn crc_vs_memcpy(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c_vs_memcpy");
    for size in [256usize, 512, 2048, 4096, 65536] {
        let (mut src_pages, mut dst_pages) = (vec![0x5au8; size + 4096], vec![0u8; size + 4096]);
        let src = &page_aligned(&mut src_pages)[..size];
        let dst = &mut page_aligned(&mut dst_pages)[..size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("crc32c", size), &src, |b, src| {
            b.iter(|| black_box(crc32c_append(0, black_box(src))))
        });
        g.bench_with_input(BenchmarkId::new("crc32c_crate", size), &src, |b, src| {
            b.iter(|| black_box(crc32c::crc32c(black_box(src))))
        });
        g.bench_with_input(BenchmarkId::new("memcpy", size), &src, |b, src| {
            b.iter(|| {
                dst.copy_from_slice(black_box(src));
                black_box(&dst);
            })
        });
        g.bench_with_input(
            BenchmarkId::new("memcpy_then_crc32c", size),
            &src,
            |b, src| {
                b.iter(|| {
                    dst.copy_from_slice(black_box(src));
                    black_box(crc32c_append(0, black_box(dst)))
                })
            },
        );
        let mut out = vec![std::mem::MaybeUninit::new(0u8); size + 4096];
        let skip = out.as_ptr().align_offset(4096);
        let out = &mut out[skip..skip + size];
        g.bench_with_input(BenchmarkId::new("crc32c_copy", size), &src, |b, src| {
            b.iter(|| black_box(crc32c_copy(0, black_box(src), &mut *out)))
        });
    }
    g.finish();
}

fn stream_hop(c: &mut Criterion) {
    use barewire_soft_rdma::stream::{SendOp, SendWr, Sge, Stream, StreamConfig};
    use barewire_soft_rdma::verbs::{Access, CompletionQueue, Device};
    let mut g = c.benchmark_group("stream_hop");
    let cfg = |qp_num, pd| StreamConfig {
        qp_num,
        pd,
        crc: false,
        mulpdu: 1024,
        ird: 4,
        ord: 4,
        remote_completion: false,
    };
    let (da, db) = (Device::new(), Device::new());
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let (acq, bcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
    let mut a = Stream::new(da.clone(), cfg(1, pa.id()), acq.clone(), acq.clone());
    let mut b = Stream::new(db.clone(), cfg(2, pb.id()), bcq.clone(), bcq.clone());
    let mut src = 42u64.to_le_bytes();
    let mut dst = [0u8; 8];
    // SAFETY: both buffers outlive their regions (the regions drop at the end of this function,
    // before the buffers).
    let smr = unsafe { pa.register(src.as_mut_ptr(), 8, Access::LOCAL_WRITE) }.unwrap();
    // SAFETY: as above.
    let dmr = unsafe {
        pb.register(
            dst.as_mut_ptr(),
            8,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
    }
    .unwrap();
    let mut small = [0u8; 512];
    g.bench_function("write_8", |bench| {
        bench.iter(|| {
            a.post_send(SendWr {
                wr_id: 1,
                op: SendOp::Write {
                    remote_addr: dmr.addr() as u64,
                    rkey: dmr.stag(),
                },
                sges: [Sge {
                    addr: smr.addr() as u64,
                    len: 8,
                    lkey: smr.stag(),
                }]
                .into(),
                signaled: false,
                fence: false,
            })
            .unwrap();
            let n = a.tx_copy(&mut small).unwrap();
            a.tx_advance(n);
            black_box(b.rx_feed(black_box(&small[..n])));
        })
    });
    g.finish();
    drop((smr, dmr));
    assert_eq!(u64::from_le_bytes(dst), 42, "the Writes placed their bytes");
}

criterion_group!(benches, fpdu_roundtrip, crc_vs_memcpy, stream_hop);
criterion_main!(benches);
