//! Real siw traffic (`tests/data/siw-rping-mpa-rev1.pcap`, a copy of `../shared/wire/`): every MPA frame and FPDU in it
//! decodes, the Read Request's fields are the values siw sent, and re-encoding gives the same
//! bytes. The capture is read with pcap-file and etherparse, not by hand.

use barewire_soft_rdma::wire::{
    encode_fpdu_header, fpdu_trailer, negotiate, DdpHeader, Fpdu, MpaFrame, MpaKind, MpaSettings,
    RdmapOpcode, ReadRequest, Segment,
};

const CLIENT_PORT: u16 = 42742;

/// The TCP payload of each direction, concatenated in capture order (the capture has no
/// retransmissions or reordering).
fn streams() -> (Vec<u8>, Vec<u8>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/siw-rping-mpa-rev1.pcap"
    );
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e} "));
    let mut reader = pcap_file::pcap::PcapReader::new(file).expect("a pcap file");
    let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
    while let Some(pkt) = reader.next_packet() {
        let pkt = pkt.expect("a readable packet");
        let sliced = etherparse::SlicedPacket::from_ethernet(&pkt.data).expect("ethernet/ipv4/tcp");
        let Some(etherparse::TransportSlice::Tcp(tcp)) = sliced.transport else {
            continue;
        };
        let dst = if tcp.source_port() == CLIENT_PORT {
            &mut to_server
        } else {
            &mut to_client
        };
        dst.extend_from_slice(tcp.payload());
    }
    (to_server, to_client)
}

/// Decodes every FPDU of a stream, checks each re-encodes to the same bytes, returns segments.
fn fpdus(stream: &[u8]) -> Vec<(Segment<'_>, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let (fpdu, used) = Fpdu::decode(&stream[at..], false, 65535)
            .expect("valid FPDU")
            .expect("complete FPDU");
        let seg = Segment::decode(fpdu.ulpdu).expect("valid DDP/RDMAP segment");
        // Re-encode: header, then the payload as is, then the trailer.
        let mut hdr = [0u8; 2];
        encode_fpdu_header(fpdu.ulpdu.len(), &mut hdr).unwrap();
        let mut ddp = [0u8; 18];
        let n = seg.encode_header(&mut ddp).unwrap();
        let mut tr = [0u8; 8];
        let t = fpdu_trailer(
            &[&hdr, &ddp[..n], seg.payload],
            fpdu.ulpdu.len(),
            false,
            &mut tr,
        );
        let again = [&hdr[..], &ddp[..n], seg.payload, &tr[..t]].concat();
        assert_eq!(
            again,
            &stream[at..at + used],
            "FPDU at stream offset {at} re-encodes identically"
        );
        out.push((seg, &stream[at..at + used]));
        at += used;
    }
    out
}

#[test]
fn the_siw_capture_decodes_and_re_encodes_identically() {
    let (to_server, to_client) = streams();

    let (req, used_req) = MpaFrame::decode(&to_server, MpaKind::Request)
        .unwrap()
        .unwrap();
    let (rep, used_rep) = MpaFrame::decode(&to_client, MpaKind::Reply)
        .unwrap()
        .unwrap();
    for (f, raw) in [
        (&req, &to_server[..used_req]),
        (&rep, &to_client[..used_rep]),
    ] {
        assert_eq!(
            (f.revision, f.markers, f.crc, f.reject, f.private_data.len()),
            (1, false, false, false, 0)
        );
        let mut buf = [0u8; 64];
        let n = f.encode(&mut buf).unwrap();
        assert_eq!(&buf[..n], raw, "the MPA frame re-encodes identically");
    }
    let neg = negotiate(
        &MpaSettings {
            crc: false,
            ..MpaSettings::default()
        },
        &rep,
    )
    .unwrap();
    assert_eq!(
        (neg.revision, neg.crc),
        (1, false),
        "a revision 1 peer is accepted, CRC off as both sent"
    );

    let client = fpdus(&to_server[used_req..]);
    assert_eq!(client.len(), 4);
    for (i, (seg, _)) in client.iter().enumerate() {
        assert_eq!(seg.opcode, RdmapOpcode::Send);
        assert!(seg.last);
        assert_eq!(seg.payload.len(), 16);
        match seg.header {
            DdpHeader::Untagged { qn, msn, mo, .. } => {
                assert_eq!((qn, msn, mo), (0, i as u32 + 1, 0))
            }
            h => panic!("a Send is untagged: {h:?}"),
        }
    }

    let server = fpdus(&to_client[used_rep..]);
    assert_eq!(server.len(), 1);
    let (seg, _) = server[0];
    assert_eq!(seg.opcode, RdmapOpcode::ReadRequest);
    assert_eq!(
        seg.header,
        DdpHeader::Untagged {
            ulp: 0,
            qn: 1,
            msn: 1,
            mo: 0
        }
    );
    let rr = ReadRequest::decode(seg.payload).unwrap();
    assert_eq!(
        rr,
        ReadRequest {
            sink_stag: 0x40cc4300,
            sink_to: 0x0000_5636_16bb_c670,
            size: 64,
            source_stag: 0xffff_e080,
            source_to: 0x0000_7fff_ffff_e080
        },
        "the values siw sent (as tshark decodes them)"
    );
    let mut body = [0u8; ReadRequest::LEN];
    rr.encode(&mut body);
    assert_eq!(&body[..], seg.payload);
}

#[test]
fn truncating_the_capture_anywhere_never_panics() {
    let (to_server, to_client) = streams();
    for stream in [&to_server, &to_client] {
        for cut in 0..stream.len() {
            let s = &stream[..cut];
            let _ = MpaFrame::decode(s, MpaKind::Request);
            let _ = MpaFrame::decode(s, MpaKind::Reply);
            let mut at = 20.min(s.len());
            while let Ok(Some((f, used))) = Fpdu::decode(&s[at..], false, 65535) {
                let _ = Segment::decode(f.ulpdu).map(|seg| ReadRequest::decode(seg.payload));
                at += used;
            }
        }
    }
}
