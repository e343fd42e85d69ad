//! Writes the fuzz targets' seed corpus into `fuzz/corpus/`: frames from the real siw capture
//! in `tests/data/` (from `../shared/wire/`) and an encoding of every frame kind.
//!
//!     cargo run -p barewire-soft-rdma --features fuzzing --example fuzz_seeds

use std::path::Path;

use barewire_soft_rdma::wire::*;

fn capture_streams() -> (Vec<u8>, Vec<u8>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/siw-rping-mpa-rev1.pcap"
    );
    let mut reader =
        pcap_file::pcap::PcapReader::new(std::fs::File::open(path).expect("the siw capture"))
            .unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    while let Some(p) = reader.next_packet() {
        let p = p.unwrap();
        let s = etherparse::SlicedPacket::from_ethernet(&p.data).unwrap();
        if let Some(etherparse::TransportSlice::Tcp(t)) = s.transport {
            if t.source_port() == 42742 {
                &mut a
            } else {
                &mut b
            }
            .extend_from_slice(t.payload());
        }
    }
    (a, b)
}

fn fpdu(seg: &Segment<'_>, body: &[u8], crc: bool) -> Vec<u8> {
    let mut out = Vec::new();
    Segment {
        payload: body,
        ..*seg
    }
    .encode_fpdu(crc, &mut out)
    .unwrap();
    out
}

fn untagged(op: RdmapOpcode, qn: u32, body: &[u8]) -> (Segment<'static>, Vec<u8>) {
    (
        Segment {
            last: true,
            opcode: op,
            header: DdpHeader::Untagged {
                ulp: 0,
                qn,
                msn: 1,
                mo: 0,
            },
            payload: &[],
        },
        body.to_vec(),
    )
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let put = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    let (to_server, to_client) = capture_streams();
    put("mpa_handshake", "siw-request", &to_server[..20]);
    put("mpa_handshake", "siw-reply", &to_client[..20]);
    let mut buf = [0u8; 600];
    let rev2 = MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc: true,
        reject: false,
        revision: 2,
        rev2: Some(Rev2Params {
            ird: 16,
            ord: 16,
            p2p: true,
            rtr_zero_send: true,
            ..Default::default()
        }),
        private_data: b"region descriptors",
    };
    let n = rev2.encode(&mut buf).unwrap();
    put("mpa_handshake", "rev2-request", &buf[..n]);
    let rej = MpaFrame {
        kind: MpaKind::Reply,
        reject: true,
        ..rev2.clone()
    };
    let n = rej.encode(&mut buf).unwrap();
    put("mpa_handshake", "rev2-rejected-reply", &buf[..n]);

    // Deframer: a control byte (CRC bit, chunk size), then a stream.
    put(
        "deframer",
        "siw-client-stream",
        &[[0x0e].as_slice(), &to_server[20..]].concat(),
    );
    put(
        "deframer",
        "siw-server-stream",
        &[[0x00].as_slice(), &to_client[20..]].concat(),
    );

    let rr = ReadRequest {
        sink_stag: 1,
        sink_to: 0x1000,
        size: 64,
        source_stag: 2,
        source_to: 0x2000,
    };
    let mut rrb = [0u8; ReadRequest::LEN];
    rr.encode(&mut rrb);
    let ar = AtomicRequest {
        op: AtomicOp::CmpSwap,
        request_id: 1,
        stag: 3,
        to: 8,
        data: 1,
        data_mask: !0,
        compare: 0,
        compare_mask: !0,
    };
    let mut arb = [0u8; AtomicRequest::LEN];
    ar.encode(&mut arb);
    let mut rsp = [0u8; AtomicResponse::LEN];
    AtomicResponse {
        request_id: 1,
        original: 0,
    }
    .encode(&mut rsp);
    let term = Terminate {
        code: TermCode::RDMAP_OPCODE,
        m: true,
        ddp: None,
        rdmap: Some(rrb),
    };
    let mut tb = [0u8; 80];
    let tn = term.encode(&mut tb).unwrap();
    let write = Segment {
        last: true,
        opcode: RdmapOpcode::Write,
        header: DdpHeader::Tagged { stag: 5, to: 0x40 },
        payload: &[],
    };
    let messages: Vec<(&str, Segment<'static>, Vec<u8>)> = vec![
        (
            "send",
            untagged(RdmapOpcode::Send, qn::SEND, b"hello").0,
            b"hello".to_vec(),
        ),
        ("write", write, vec![7; 100]),
        (
            "read-request",
            untagged(RdmapOpcode::ReadRequest, qn::READ_REQUEST, &rrb).0,
            rrb.to_vec(),
        ),
        (
            "atomic-request",
            untagged(RdmapOpcode::AtomicRequest, qn::ATOMIC_REQUEST, &arb).0,
            arb.to_vec(),
        ),
        (
            "atomic-response",
            untagged(RdmapOpcode::AtomicResponse, qn::ATOMIC_RESPONSE, &rsp).0,
            rsp.to_vec(),
        ),
        (
            "terminate",
            untagged(RdmapOpcode::Terminate, qn::TERMINATE, &tb[..tn]).0,
            tb[..tn].to_vec(),
        ),
        (
            "immediate",
            untagged(RdmapOpcode::ImmediateData, qn::SEND, &[1; 8]).0,
            vec![1; 8],
        ),
    ];
    let mut stream_crc = vec![0x01];
    for (name, seg, body) in &messages {
        let f = fpdu(seg, body, true);
        let (d, _) = Fpdu::decode(&f, true, 65535).unwrap().unwrap();
        put("ddp_rdmap", name, d.ulpdu);
        stream_crc.extend_from_slice(&f);
    }
    put("deframer", "every-opcode-crc", &stream_crc);
    let mut at = 20;
    while at < to_server.len() {
        let (f, used) = Fpdu::decode(&to_server[at..], false, 65535)
            .unwrap()
            .unwrap();
        put("ddp_rdmap", &format!("siw-send-{at}"), f.ulpdu);
        at += used;
    }
    let (f, _) = Fpdu::decode(&to_client[20..], false, 65535)
        .unwrap()
        .unwrap();
    put("ddp_rdmap", "siw-read-request", f.ulpdu);
    // The live stream's seeds name its arena's regions; the harnesses exist only with the
    // `fuzzing` feature.
    #[cfg(feature = "fuzzing")]
    for (name, bytes) in barewire_soft_rdma::stream::fuzz::seeds() {
        put("live_stream", name, &bytes);
    }
    #[cfg(feature = "fuzzing")]
    for (name, bytes) in barewire_soft_rdma::stream::fuzz::pair::seeds() {
        put("stream_pair", &name, &bytes);
    }
    #[cfg(not(feature = "fuzzing"))]
    eprintln!("live_stream and stream_pair seeds skipped: run with --features fuzzing");
    println!("seeds written to {}", root.display());
}
