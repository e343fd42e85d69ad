//! The checks the fuzz targets run, here so that `cargo test` replays the same checks over the
//! committed corpus (`fuzz/corpus/`) on stable Rust. Each takes arbitrary bytes and panics only
//! if the codec breaks one of its promises: decoding never panics, what decodes re-encodes to
//! the same frame, and buffering stays bounded.

use super::*;

/// Runs `check` over every input of `target`'s corpus (`fuzz/corpus/<target>/`, the seeds
/// plus whatever the fuzzers kept) and crash reproducers (`fuzz/regressions/<target>/`),
/// panicking with the file's name at the first that fails; returns how many ran (at least
/// one: an empty corpus is a failure too). For `cargo test`, so CI replays what the fuzzers
/// found on stable Rust.
pub fn replay_corpus(target: &str, check: fn(&[u8])) -> usize {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut n = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries {
            let path = e.expect("a directory entry").path();
            let bytes = std::fs::read(&path).expect("a corpus file");
            let r = std::panic::catch_unwind(|| check(&bytes));
            assert!(r.is_ok(), "{} fails {target}'s checks", path.display());
            n += 1;
        }
    }
    assert!(n > 0, "the {target} corpus is empty");
    n
}

/// Runs `check` on each of `seeds` and asserts that each is committed as
/// `fuzz/corpus/<target>/seed-<i>` (with `BAREWIRE_WRITE_SEEDS` set, writes them there first).
/// For `cargo test`, so a seed that changes in code and not in the corpus is caught.
pub fn check_seeds(target: &str, seeds: &[Vec<u8>], check: fn(&[u8])) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (i, s) in seeds.iter().enumerate() {
        check(s);
        let path = root.join(target).join(format!("seed-{i}"));
        if std::env::var_os("BAREWIRE_WRITE_SEEDS").is_some() {
            std::fs::create_dir_all(path.parent().expect("a corpus directory"))
                .expect("the corpus directory can be made");
            std::fs::write(&path, s).expect("a seed can be written");
        }
        assert_eq!(
            std::fs::read(&path).ok().as_ref(),
            Some(s),
            "{}",
            path.display()
        );
    }
}

/// MPA Request/Reply parsing and negotiation.
pub fn mpa_handshake(data: &[u8]) {
    for kind in [MpaKind::Request, MpaKind::Reply] {
        if let Ok(Some((f, used))) = MpaFrame::decode(data, kind) {
            assert!(used <= data.len() && used >= MPA_HEADER_LEN);
            let mut buf = [0u8; MPA_HEADER_LEN + MPA_MAX_PRIVATE_DATA];
            let n = f.encode(&mut buf).expect("a decoded frame re-encodes");
            let (g, m) = MpaFrame::decode(&buf[..n], kind)
                .expect("re-encoded frame decodes")
                .expect("complete");
            assert_eq!((g, m), (f.clone(), n));
            let _ = negotiate(&MpaSettings::default(), &f);
        }
    }
}

/// The stream deframer fed in chunks, each ULPDU decoded and run through reassembly.
pub fn deframer(data: &[u8]) {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let crc = ctl & 1 != 0;
    let chunk = (ctl >> 1) as usize % 64 + 1;
    let max = 256;
    let mut d = Deframer::new(crc, max);
    let mut r = Reassembly::default();
    for c in rest.chunks(chunk) {
        let res = d.feed(c, |u| {
            let seg = Segment::decode(u)?;
            body(&seg);
            r.accept(&seg).map(drop)
        });
        assert!(d.buffered() <= max, "deframer buffer stays bounded");
        if res.is_err() {
            return;
        }
    }
}

/// DDP/RDMAP segment decoding, with the header re-encoded.
pub fn ddp_rdmap(data: &[u8]) {
    let Ok(seg) = Segment::decode(data) else {
        return;
    };
    let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
    let n = seg.encode_header(&mut hdr).expect("header fits");
    assert_eq!(n + seg.payload.len(), data.len());
    // Reserved bits are ignored on receive and zero on transmit (RFC 5041 §4.1).
    let mut want = data[..n].to_vec();
    want[0] &= !0x3c;
    want[1] &= !0x30;
    assert_eq!(&hdr[..n], &want[..]);
    body(&seg);
}

fn body(seg: &Segment<'_>) {
    match seg.opcode {
        RdmapOpcode::ReadRequest => {
            if let Ok(rr) = ReadRequest::decode(seg.payload) {
                let mut b = [0u8; ReadRequest::LEN];
                rr.encode(&mut b);
                assert_eq!(&b[..], seg.payload);
            }
        }
        RdmapOpcode::Terminate => {
            if let Ok(t) = Terminate::decode(seg.payload) {
                let mut b = [0u8; 80];
                let n = t.encode(&mut b).expect("fits");
                assert_eq!(Terminate::decode(&b[..n]), Ok(t));
            }
        }
        RdmapOpcode::AtomicRequest => {
            if let Ok(a) = AtomicRequest::decode(seg.payload) {
                let mut b = [0u8; AtomicRequest::LEN];
                a.encode(&mut b);
                assert_eq!(AtomicRequest::decode(&b), Ok(a));
            }
        }
        RdmapOpcode::AtomicResponse => {
            let _ = AtomicResponse::decode(seg.payload);
        }
        RdmapOpcode::ImmediateData | RdmapOpcode::ImmediateDataSe => {
            let _ = ImmediateData::decode(seg.payload);
        }
        _ => {}
    }
}

/// The private data of an MPA Request or Reply (revision 2, enhanced: the IRD/ORD words, then
/// the application's bytes, here a region descriptor as `barewire-peer` sends them), behind a
/// valid header so that every input exercises the private-data path: it decodes or is
/// refused, negotiation stays within what both sides offered, and a descriptor in it
/// round-trips.
pub fn mpa_private_data(data: &[u8]) {
    let Some((&ctl, pd)) = data.split_first() else {
        return;
    };
    let pd = &pd[..pd.len().min(MPA_MAX_PRIVATE_DATA)];
    let kind = if ctl & 1 == 0 {
        MpaKind::Request
    } else {
        MpaKind::Reply
    };
    let mut frame = [0u8; MPA_HEADER_LEN + MPA_MAX_PRIVATE_DATA];
    let header = MpaFrame {
        kind,
        markers: false,
        crc: ctl & 2 != 0,
        reject: false,
        revision: 2,
        rev2: Some(Rev2Params::default()),
        private_data: &[],
    };
    header.encode(&mut frame).expect("a header encodes");
    frame[18..20].copy_from_slice(&(pd.len() as u16).to_be_bytes());
    frame[MPA_HEADER_LEN..MPA_HEADER_LEN + pd.len()].copy_from_slice(pd);
    let Ok(Some((f, used))) = MpaFrame::decode(&frame[..MPA_HEADER_LEN + pd.len()], kind) else {
        return;
    };
    assert_eq!(used, MPA_HEADER_LEN + pd.len());
    let local = MpaSettings::default();
    if let Ok(n) = negotiate(&local, &f) {
        // Never more than either side offered (a peer cannot raise our IRD).
        match f.rev2 {
            Some(p) => assert_eq!((n.ird, n.ord), (local.ird.min(p.ord), local.ord.min(p.ird))),
            None => assert_eq!((n.ird, n.ord), (1, 1)),
        }
        assert!(n.ird <= local.ird && n.ord <= local.ord);
    }
    if let Some(d) = crate::provider::RegionDescriptor::from_bytes(f.private_data) {
        let b = d.to_bytes();
        assert_eq!(
            &b[..],
            &f.private_data[..crate::provider::RegionDescriptor::LEN]
        );
    }
}
