//! The iWARP codec's cost per FPDU, and CRC32c beside memcpy on this machine.
//!
//! - `fpdu_roundtrip/{64,4096}`: encode a Send segment's header and trailer (CRC32c on), then
//!   deframe, check the CRC and decode it: what one FPDU costs both ends, minus the socket.
//! - `crc32c_vs_memcpy/{256,512,2048,4096,65536}`: CRC32c over a buffer as the provider computes
//!   it (`crc32c_append`, folding with carry-less multiplies from 512 bytes where the CPU can),
//!   the `crc32c` crate's own code beside it, and copying the buffer: what the soft provider pays
//!   per byte when CRC is negotiated on.

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

fn crc_vs_memcpy(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c_vs_memcpy");
    for size in [256usize, 512, 2048, 4096, 65536] {
        let src = vec![0x5au8; size];
        let mut dst = vec![0u8; size];
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
    }
    g.finish();
}

criterion_group!(benches, fpdu_roundtrip, crc_vs_memcpy);
criterion_main!(benches);
