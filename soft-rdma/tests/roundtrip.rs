//! Property tests: every frame kind round-trips through encode and decode, any segmentation of
//! any message reassembles, any chunking of the stream deframes, and arbitrary bytes never
//! make a decoder panic.

use barewire_soft_rdma::wire::*;
use proptest::prelude::*;

fn opcode() -> impl Strategy<Value = RdmapOpcode> {
    prop::sample::select(vec![
        RdmapOpcode::Write,
        RdmapOpcode::ReadRequest,
        RdmapOpcode::ReadResponse,
        RdmapOpcode::Send,
        RdmapOpcode::SendInvalidate,
        RdmapOpcode::SendSe,
        RdmapOpcode::SendSeInvalidate,
        RdmapOpcode::Terminate,
        RdmapOpcode::ImmediateData,
        RdmapOpcode::ImmediateDataSe,
        RdmapOpcode::AtomicRequest,
        RdmapOpcode::AtomicResponse,
    ])
}

fn header_for(op: RdmapOpcode) -> BoxedStrategy<DdpHeader> {
    if op.is_tagged() {
        (any::<u32>(), any::<u64>())
            .prop_map(|(stag, to)| DdpHeader::Tagged { stag, to })
            .boxed()
    } else {
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(ulp, qn, msn, mo)| DdpHeader::Untagged { ulp, qn, msn, mo })
            .boxed()
    }
}

fn frame(seg: &Segment<'_>, crc: bool) -> Vec<u8> {
    let mut out = Vec::new();
    seg.encode_fpdu(crc, &mut out).unwrap();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mpa_frames_round_trip(
        reply in any::<bool>(), markers in any::<bool>(), crc in any::<bool>(), reject in any::<bool>(),
        rev2 in prop::option::of((0u16..0x4000, 0u16..0x4000, any::<[bool; 4]>())),
        pd in prop::collection::vec(any::<u8>(), 0..=508),
    ) {
        let kind = if reply { MpaKind::Reply } else { MpaKind::Request };
        let rev2 = rev2.map(|(ird, ord, b)| Rev2Params { ird, ord, p2p: b[0], rtr_zero_send: b[1], rtr_zero_write: b[2], rtr_zero_read: b[3] });
        let f = MpaFrame { kind, markers, crc, reject, revision: if rev2.is_some() { 2 } else { 1 }, rev2, private_data: &pd };
        let mut buf = vec![0u8; 600];
        let n = f.encode(&mut buf).unwrap();
        let (g, used) = MpaFrame::decode(&buf[..n], kind).unwrap().unwrap();
        prop_assert_eq!(used, n);
        prop_assert_eq!(g, f);
    }

    #[test]
    fn segments_round_trip_through_any_chunking(
        (op, header) in opcode().prop_flat_map(|op| (Just(op), header_for(op))), last in any::<bool>(), crc in any::<bool>(),
        payload in prop::collection::vec(any::<u8>(), 0..300), chunk in 1usize..80,
    ) {
        let seg = Segment { last, opcode: op, header, payload: &payload };
        let wire = [frame(&seg, crc), frame(&seg, crc)].concat();
        let mut d = Deframer::new(crc, 1024);
        let mut got = Vec::new();
        for c in wire.chunks(chunk) {
            d.feed(c, |u| { got.push(u.to_vec()); Ok(()) }).unwrap();
        }
        prop_assert_eq!(got.len(), 2);
        for u in &got {
            prop_assert_eq!(Segment::decode(u).unwrap(), seg);
        }
    }

    #[test]
    fn any_segmentation_reassembles(len in 0usize..5000, mulpdu in 20usize..2000, tagged in any::<bool>()) {
        let mut r = Reassembly::default();
        let payload = vec![0u8; len];
        let mut covered = 0;
        let hlen = if tagged { TAGGED_HEADER_LEN } else { UNTAGGED_HEADER_LEN };
        for (off, n, last) in split(len, hlen, mulpdu) {
            prop_assert!(hlen + n <= mulpdu.max(hlen + 1));
            let header = if tagged { DdpHeader::Tagged { stag: 9, to: 1000 + off as u64 } } else { DdpHeader::Untagged { ulp: 0, qn: 0, msn: 1, mo: off as u32 } };
            let op = if tagged { RdmapOpcode::Write } else { RdmapOpcode::Send };
            let placed = r.accept(&Segment { last, opcode: op, header, payload: &payload[off..off + n] }).unwrap();
            let is_last = matches!(placed, Placement::Tagged { last: true, .. } | Placement::Untagged { last: true, .. });
            prop_assert_eq!(is_last, last);
            covered += n;
        }
        prop_assert_eq!(covered, len);
    }

    #[test]
    fn bodies_round_trip(
        a in any::<(u32, u64, u32, u32, u64)>(), op in 0u8..3, id in any::<u32>(), vals in any::<[u64; 5]>(),
        layer in 0u8..3, etype in 0u8..16, code in any::<u8>(), m in any::<bool>(), d in any::<bool>(), r in any::<bool>(), tagged in any::<bool>(),
    ) {
        let rr = ReadRequest { sink_stag: a.0, sink_to: a.1, size: a.2, source_stag: a.3, source_to: a.4 };
        let mut b = [0u8; ReadRequest::LEN];
        rr.encode(&mut b);
        prop_assert_eq!(ReadRequest::decode(&b).unwrap(), rr);

        let op = [AtomicOp::FetchAdd, AtomicOp::Swap, AtomicOp::CmpSwap][op as usize];
        let ar = AtomicRequest { op, request_id: id, stag: a.0, to: vals[0], data: vals[1], data_mask: vals[2], compare: vals[3], compare_mask: vals[4] };
        let mut b = [0u8; AtomicRequest::LEN];
        ar.encode(&mut b);
        prop_assert_eq!(AtomicRequest::decode(&b).unwrap(), ar);

        let layer = [Layer::Rdmap, Layer::Ddp, Layer::Llp][layer as usize];
        let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
        let seg = Segment { last: true, opcode: if tagged { RdmapOpcode::Write } else { RdmapOpcode::Send }, header: if tagged { DdpHeader::Tagged { stag: a.0, to: a.1 } } else { DdpHeader::Untagged { ulp: 0, qn: 0, msn: a.2, mo: 0 } }, payload: &[] };
        let hlen = seg.encode_header(&mut hdr).unwrap();
        let t = Terminate { code: TermCode { layer, etype, code }, m, ddp: d.then_some((a.2 as u16, hdr, hlen)), rdmap: r.then_some([0x5a; 28]) };
        let mut b = [0u8; 80];
        let n = t.encode(&mut b).unwrap();
        prop_assert_eq!(Terminate::decode(&b[..n]).unwrap(), t);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), crc in any::<bool>()) {
        let _ = MpaFrame::decode(&bytes, MpaKind::Request);
        let _ = MpaFrame::decode(&bytes, MpaKind::Reply);
        let _ = Segment::decode(&bytes);
        let _ = Terminate::decode(&bytes);
        let _ = AtomicRequest::decode(&bytes);
        let _ = ReadRequest::decode(&bytes);
        let mut d = Deframer::new(crc, 128);
        let mut r = Reassembly::default();
        let _ = d.feed(&bytes, |u| { if let Ok(s) = Segment::decode(u) { let _ = r.accept(&s); } Ok(()) });
        prop_assert!(d.buffered() <= 2 + 128 + 7);
    }
}
