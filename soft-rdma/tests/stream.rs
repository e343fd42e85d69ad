//! Two RDMAP streams wired back to back in memory: every verb end to end with the bytes checked
//! in the target region, protection violations answered by the right Terminate with guard bytes
//! untouched, and completion statuses as verbs define them. The byte pump delivers the stream
//! in uneven chunks, so every receive state is crossed at every offset.

use barewire_soft_rdma::stream::{RecvWr, SendOp, SendWr, Sge, Stream, StreamConfig};
use barewire_soft_rdma::verbs::{
    Access, CompletionQueue, Device, MemoryRegion, QpState, Stag, WcOpcode, WcStatus,
    WorkCompletion,
};
use barewire_soft_rdma::wire::{
    DdpTaggedErrorCode, DdpUntaggedErrorCode, MpaErrorCode, RdmapErrorCode, RdmapErrorType,
    TermCode,
};

const GUARD: usize = 64;

struct Side {
    dev: Device,
    pd: barewire_soft_rdma::verbs::ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    stream: Stream,
}

fn side(qp: u32, crc: bool, ord: u16) -> Side {
    side_with(qp, crc, ord, false, 1024)
}

fn side_with(qp: u32, crc: bool, ord: u16, remote_completion: bool, mulpdu: usize) -> Side {
    let dev = Device::new();
    let pd = dev.alloc_pd();
    let (scq, rcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
    let cfg = StreamConfig {
        qp_num: qp,
        pd: pd.id(),
        crc,
        mulpdu,
        ird: 4,
        ord,
        remote_completion,
    };
    let stream = Stream::new(dev.clone(), cfg, scq.clone(), rcq.clone());
    Side {
        dev,
        pd,
        scq,
        rcq,
        stream,
    }
}

/// A buffer with guard bytes on both sides; only the middle is registered.
struct Guarded {
    /// Words, so that the region (GUARD bytes in) is 8-byte aligned, as an atomic's target
    /// must be; seen as bytes through `bytes`.
    mem: Vec<u64>,
    len: usize,
    mr: Option<MemoryRegion>,
}

impl Guarded {
    fn new(s: &Side, len: usize, access: Access, fill: u8) -> Guarded {
        let mut mem = vec![u64::from_ne_bytes([0xEE; 8]); (len + 2 * GUARD).div_ceil(8)];
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` holds at least len + 2 * GUARD bytes; u8 has no alignment or validity
        // requirements.
        unsafe { std::slice::from_raw_parts_mut(base.add(GUARD), len) }.fill(fill);
        // SAFETY: `mem` is never reallocated and outlives the region (dropped first, below).
        let mr = unsafe { s.pd.register(base.add(GUARD), len, access) }.unwrap();
        Guarded {
            mem,
            len,
            mr: Some(mr),
        }
    }
    /// The region with its guards on either side.
    fn bytes(&self) -> &[u8] {
        // SAFETY: as in `new`; the stream writes these bytes only inside its calls, which
        // do not overlap this borrow.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr().cast::<u8>(), self.len + 2 * GUARD) }
    }
    fn addr(&self) -> u64 {
        self.mr.as_ref().unwrap().addr() as u64
    }
    fn stag(&self) -> Stag {
        self.mr.as_ref().unwrap().stag()
    }
    fn data(&self) -> &[u8] {
        &self.bytes()[GUARD..GUARD + self.len]
    }
    fn guards_intact(&self) -> bool {
        let b = self.bytes();
        b[..GUARD]
            .iter()
            .chain(&b[GUARD + self.len..])
            .all(|&b| b == 0xEE)
    }
    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr() + off as u64,
            len: len as u32,
            lkey: self.stag(),
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.mr.take();
    }
}

/// The bytes `stream` offers to send now, through at most `entries` gather entries.
fn listed(stream: &mut Stream, entries: usize) -> Vec<u8> {
    let mut iov = [std::io::IoSlice::new(&[]); 64];
    let n = stream.tx_iovecs(&mut iov[..entries]);
    iov[..n].iter().flat_map(|s| s.iter().copied()).collect()
}

/// Moves bytes both ways until nothing is left to send, in chunks of varying size.
fn pump(a: &mut Side, b: &mut Side, chunk: usize) {
    let mut round = 0;
    while transfer(a, b, chunk, &mut round) | transfer(b, a, chunk, &mut round) {}
}

/// Sends everything `from` has queued into `to`; false if there was nothing.
fn transfer(from: &mut Side, to: &mut Side, chunk: usize, round: &mut usize) -> bool {
    let bytes = listed(&mut from.stream, 64);
    if bytes.is_empty() {
        return false;
    }
    from.stream.tx_advance(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let n = (chunk + *round % 7).min(bytes.len() - at);
        if to.stream.rx_feed(&bytes[at..at + n]) < n {
            break; // the receiver died (Terminate): the rest is dropped, as by a closed socket
        }
        at += n;
        *round += 1;
    }
    true
}

/// A signaled RDMA Write of `sge` to `off` bytes into `to`.
fn write_wr(wr_id: u64, sge: Sge, to: &Guarded, off: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write {
            remote_addr: to.addr() + off,
            rkey: to.stag(),
        },
        sges: [sge].into(),
        signaled: true,
        fence: false,
    }
}

fn drain(cq: &CompletionQueue) -> Vec<WorkCompletion> {
    let mut out = vec![WorkCompletion::BLANK; 64];
    let n = cq.poll(&mut out);
    out.truncate(n);
    out
}

#[test]
fn send_lands_in_the_posted_receive_across_sges() {
    for chunk in [1, 3, 17, 4096] {
        let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
        let src = Guarded::new(&a, 256, Access::LOCAL_WRITE, 0);
        let dst = Guarded::new(&b, 256, Access::LOCAL_WRITE, 0);
        let msg: Vec<u8> = (0..200u8).collect();
        // SAFETY: writing our own local buffer before posting.
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), src.addr() as *mut u8, msg.len()) };
        b.stream
            .post_recv(RecvWr {
                wr_id: 7,
                sges: [dst.sge(0, 50), dst.sge(100, 156)].into(),
            })
            .unwrap();
        a.stream
            .post_send(SendWr {
                wr_id: 1,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sges: [src.sge(0, 120), src.sge(120, 80)].into(),
                signaled: true,
                fence: false,
            })
            .unwrap();
        pump(&mut a, &mut b, chunk);
        let rc = drain(&b.rcq);
        assert_eq!(rc.len(), 1);
        assert_eq!(
            (rc[0].wr_id, rc[0].status, rc[0].byte_len),
            (7, WcStatus::Success, 200)
        );
        assert_eq!(&dst.data()[..50], &msg[..50]);
        assert_eq!(&dst.data()[100..250], &msg[50..]);
        assert!(
            dst.data()[50..100].iter().all(|&x| x == 0),
            "the gap between SGEs is untouched"
        );
        assert_eq!(drain(&a.scq)[0].status, WcStatus::Success);
        assert!(dst.guards_intact());
    }
}

#[test]
fn write_larger_than_one_fpdu_lands_exactly_with_and_without_crc() {
    for crc in [false, true] {
        let (mut a, mut b) = (side(1, crc, 4), side(2, crc, 4));
        let src = Guarded::new(&a, 5000, Access::LOCAL_WRITE, 0x5A);
        let dst = Guarded::new(&b, 8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
        a.stream
            .post_send(write_wr(2, src.sge(0, 5000), &dst, 100))
            .unwrap();
        pump(&mut a, &mut b, 333);
        assert!(dst.data()[100..5100].iter().all(|&x| x == 0x5A));
        assert!(dst.data()[..100]
            .iter()
            .chain(&dst.data()[5100..])
            .all(|&x| x == 0));
        assert!(dst.guards_intact());
        let wc = drain(&a.scq);
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].opcode, wc[0].byte_len),
            (2, WcStatus::Success, WcOpcode::RdmaWrite, 5000)
        );
        assert_eq!(b.stream.state(), QpState::Rts);
    }
}

#[test]
fn read_brings_remote_bytes_and_respects_ord() {
    let (mut a, mut b) = (side(1, true, 2), side(2, true, 4));
    let src = Guarded::new(&b, 6000, Access::REMOTE_READ, 0);
    let pattern: Vec<u8> = (0..6000).map(|i| (i % 251) as u8).collect();
    // SAFETY: filling our own registered buffer before the peer reads it.
    unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), src.addr() as *mut u8, 6000) };
    let sink = Guarded::new(&a, 4 * 1500, Access::LOCAL_WRITE, 0);
    for i in 0..4u64 {
        let wr = SendWr {
            wr_id: 10 + i,
            op: SendOp::Read {
                remote_addr: src.addr() + i * 1500,
                rkey: src.stag(),
            },
            sges: [sink.sge(i as usize * 1500, 1500)].into(),
            signaled: true,
            fence: false,
        };
        a.stream.post_send(wr).unwrap();
    }
    pump(&mut a, &mut b, 100);
    let wcs = drain(&a.scq);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        (10..14)
            .map(|i| (i, WcStatus::Success, 1500))
            .collect::<Vec<_>>()
    );
    assert_eq!(sink.data(), &pattern[..]);
    assert!(sink.guards_intact());
}

/// A (qp 1) Reads 3000 bytes of B's region (filled with 1s) into its sink; the Read Request
/// has reached B, whose response is queued and not yet sent.
fn read_request_delivered(crc: bool) -> (Side, Side, Guarded, Guarded) {
    let (mut a, mut b) = (side(1, crc, 4), side(2, crc, 4));
    let src = Guarded::new(&b, 3000, Access::REMOTE_READ, 1);
    let sink = Guarded::new(&a, 3000, Access::LOCAL_WRITE, 0);
    deliver_read(&mut a, &mut b, 7, &src, &sink);
    (a, b, src, sink)
}

/// A posts a Read (`wr_id`) of all of `src` into all of `sink`, and its request reaches B.
fn deliver_read(a: &mut Side, b: &mut Side, wr_id: u64, src: &Guarded, sink: &Guarded) {
    let len = src.data().len();
    a.stream
        .post_send(SendWr {
            wr_id,
            op: SendOp::Read {
                remote_addr: src.addr(),
                rkey: src.stag(),
            },
            sges: [sink.sge(0, len)].into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
    let mut round = 0;
    assert!(transfer(a, b, 100, &mut round), "the Read Request");
}

/// With CRC, a Read Response leaves as snapshots of its segments, and one send takes snapshots
/// worth up to 1 MiB, as a send without CRC takes up to 1 MiB of responses from the region: at
/// the default MULPDU (16 KiB) a 2 MiB READ goes in two or three gather lists, not in pieces of
/// eight segments (128 KiB, which made each byte cost the kernel's TCP more). Every byte lands,
/// under a CRC that matches.
#[test]
fn a_send_takes_up_to_a_mebibyte_of_read_response_snapshots() {
    const MIB: usize = 1 << 20;
    let (mut a, mut b) = (
        side_with(1, true, 4, false, 16 << 10),
        side_with(2, true, 4, false, 16 << 10),
    );
    let src = Guarded::new(&b, 2 * MIB, Access::REMOTE_READ, 0);
    // SAFETY: our own registered buffer, written before the Read is served.
    unsafe { std::slice::from_raw_parts_mut(src.addr() as *mut u8, 2 * MIB) }
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i % 251) as u8);
    let sink = Guarded::new(&a, 2 * MIB, Access::LOCAL_WRITE, 0);
    deliver_read(&mut a, &mut b, 7, &src, &sink);
    let mut sends = Vec::new();
    loop {
        let mut iov = [std::io::IoSlice::new(&[]); 512];
        let n = b.stream.tx_iovecs(&mut iov);
        let bytes: Vec<u8> = iov[..n].iter().flat_map(|s| s.iter().copied()).collect();
        if bytes.is_empty() {
            break;
        }
        b.stream.tx_advance(bytes.len());
        assert_eq!(a.stream.rx_feed(&bytes), bytes.len());
        sends.push(bytes.len());
    }
    // 1 MiB of snapshots is 64 segments: at most 1 MiB of payload, with 64 FPDUs' framing
    // (length field, headers, pad and CRC: under 64 bytes each).
    assert!(
        sends[0] > MIB - (16 << 10) && sends[0] <= MIB + 64 * 64,
        "the first send took {} bytes: {sends:?}",
        sends[0]
    );
    assert!(sends.len() <= 3, "{sends:?}");
    assert_eq!(a.stream.last_terminate(), None);
    assert_eq!(sink.data(), src.data(), "the bytes read");
    assert!(sink.guards_intact());
    let done = drain(&a.scq);
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].wr_id, done[0].status), (7, WcStatus::Success));
}

/// The responder's memory may change between a Read Request's arrival and its response's
/// transmission (a later Write, the owner's CPU). With CRC, the CRC must cover the bytes that
/// actually leave, or the reader sees a CRC error and the connection dies.
#[test]
fn a_read_response_with_crc_covers_the_bytes_as_sent() {
    let (mut a, mut b, src, sink) = read_request_delivered(true);
    // B has queued the response; its memory changes before anything is sent.
    // SAFETY: our own registered buffer, written between two calls into the stream.
    unsafe { std::ptr::write_bytes(src.addr() as *mut u8, 2, 3000) };
    pump(&mut a, &mut b, 100);
    assert_eq!(a.stream.last_terminate(), None);
    let wcs = drain(&a.scq);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(7, WcStatus::Success)]
    );
    assert!(sink.data().iter().all(|&x| x == 2), "the bytes as sent");
}

/// Snapshots reuse buffers from one response to the next: each response still carries the bytes
/// its source held when it left, never an earlier response's.
#[test]
fn read_responses_with_crc_in_reused_buffers_carry_their_own_bytes() {
    let (mut a, mut b) = (side(1, true, 4), side(2, true, 4));
    let src = Guarded::new(&b, 3000, Access::REMOTE_READ, 1);
    for (i, value) in (10u8..16).enumerate() {
        let sink = Guarded::new(&a, 3000, Access::LOCAL_WRITE, 0);
        deliver_read(&mut a, &mut b, i as u64, &src, &sink);
        // SAFETY: our own registered buffer, written between two calls into the stream.
        unsafe { std::ptr::write_bytes(src.addr() as *mut u8, value, 3000) };
        pump(&mut a, &mut b, 700);
        assert_eq!(a.stream.last_terminate(), None);
        let wcs = drain(&a.scq);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(i as u64, WcStatus::Success)]
        );
        assert!(sink.data().iter().all(|&x| x == value), "response {i}");
        assert!(sink.guards_intact());
    }
}

/// A counter word written again and again (a channel's credit, say) changes while its last
/// Write waits to be sent. With CRC the Write must still arrive intact: small segments are
/// copied when posted, so they carry the value of that moment.
#[test]
fn a_small_write_carries_the_value_it_was_posted_with() {
    let (mut a, mut b) = (side(1, true, 4), side(2, true, 4));
    let word = Guarded::new(&a, 8, Access::LOCAL_WRITE, 5);
    let dst = Guarded::new(&b, 8, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    a.stream
        .post_send(write_wr(1, word.sge(0, 8), &dst, 0))
        .unwrap();
    // SAFETY: our own registered word, written between two calls into the stream.
    unsafe { std::ptr::write_bytes(word.addr() as *mut u8, 6, 8) };
    pump(&mut a, &mut b, 5);
    assert_eq!(b.stream.last_terminate(), None);
    assert_eq!(dst.data(), &[5; 8]);
}

/// A Read Response waits in the responder's queue, and its owner deregisters the region
/// meanwhile: the bytes must not be read from memory that is no longer registered (it may be
/// freed and reused); the responder's stream stops instead, as a cut connection would.
#[test]
fn a_read_response_whose_region_was_deregistered_is_not_sent() {
    for crc in [false, true] {
        let (_a, mut b, mut src, sink) = read_request_delivered(crc);
        assert!(b.stream.wants_tx(), "the response is queued");
        src.mr.take(); // deregistered
        let mut iov = [std::io::IoSlice::new(&[]); 64];
        assert_eq!(b.stream.tx_iovecs(&mut iov), 0, "crc {crc}: bytes offered");
        assert!(b.stream.rx_dead() && !b.stream.wants_tx(), "crc {crc}");
        assert!(sink.data().iter().all(|&x| x == 0));
    }
}

/// `tx_copy` also refuses to read a deregistered source, and stops the stream.
#[test]
fn a_small_read_response_whose_region_was_deregistered_is_not_copied() {
    for crc in [false, true] {
        let (mut a, mut b) = (side(1, crc, 4), side(2, crc, 4));
        let mut src = Guarded::new(&b, 100, Access::REMOTE_READ, 1);
        let sink = Guarded::new(&a, 100, Access::LOCAL_WRITE, 0);
        deliver_read(&mut a, &mut b, 7, &src, &sink);
        assert!(b.stream.wants_tx(), "the response is queued");
        src.mr.take(); // deregistered
        let mut small = [0u8; 512];
        assert_eq!(b.stream.tx_copy(&mut small), Some(0), "crc {crc}");
        assert!(b.stream.rx_dead() && !b.stream.wants_tx(), "crc {crc}");
    }
}

/// A send takes 5 bytes of what `from` has queued, and `tx_copy` the rest, into `to`.
fn small_send_after_five_bytes(from: &mut Side, to: &mut Side, crc: bool) {
    let whole = listed(&mut from.stream, 64);
    assert!(whole.len() > 5);
    from.stream.tx_advance(5);
    to.stream.rx_feed(&whole[..5]);
    let rest = listed(&mut from.stream, 64);
    assert_eq!(rest, whole[5..], "crc {crc}");
    let mut short = vec![0u8; rest.len() - 1];
    assert_eq!(from.stream.tx_copy(&mut short), None, "crc {crc}");
    let mut small = [0u8; 512];
    let n = from.stream.tx_copy(&mut small).expect("fits");
    assert_eq!(small[..n], rest[..], "crc {crc}");
    from.stream.tx_advance(n);
    assert_eq!(to.stream.rx_feed(&small[..n]), n, "crc {crc}");
    assert!(!from.stream.wants_tx());
}

/// A small send copies exactly what the gather list names: every queued chunk, the front one
/// from where the last send stopped, Read Response snapshots (with CRC) included; and nothing
/// when it would not all fit.
#[test]
fn a_small_send_copies_what_the_gather_list_names() {
    for crc in [false, true] {
        let (mut a, mut b) = (side(1, crc, 4), side(2, crc, 4));
        let words = Guarded::new(&a, 24, Access::LOCAL_WRITE, 3);
        let dst = Guarded::new(&b, 24, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
        let src = Guarded::new(&b, 40, Access::REMOTE_READ, 9);
        let sink = Guarded::new(&a, 40, Access::LOCAL_WRITE, 0);
        // B queues a Read Response (a snapshot with CRC), then three Writes go from A.
        deliver_read(&mut a, &mut b, 1, &src, &sink);
        for k in 0..3u64 {
            a.stream
                .post_send(write_wr(10 + k, words.sge(8 * k as usize, 8), &dst, 8 * k))
                .unwrap();
        }
        small_send_after_five_bytes(&mut b, &mut a, crc);
        small_send_after_five_bytes(&mut a, &mut b, crc);
        // A second response, copied before anything listed it (its snapshot taken there).
        let sink2 = Guarded::new(&a, 40, Access::LOCAL_WRITE, 0);
        deliver_read(&mut a, &mut b, 2, &src, &sink2);
        let mut small = [0u8; 512];
        let n = b.stream.tx_copy(&mut small).expect("fits");
        b.stream.tx_advance(n);
        assert_eq!(a.stream.rx_feed(&small[..n]), n, "crc {crc}");
        assert_eq!(sink2.data(), &[9; 40], "crc {crc}");
        assert_eq!(
            (a.stream.last_terminate(), b.stream.last_terminate()),
            (None, None)
        );
        assert_eq!(dst.data(), &[3; 24], "crc {crc}");
        assert_eq!(sink.data(), &[9; 40], "crc {crc}");
        assert!(dst.guards_intact() && sink.guards_intact());
        let done: Vec<_> = drain(&a.scq).iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(done.len(), 5, "crc {crc}: {done:?}");
        assert!(done.iter().all(|d| d.1 == WcStatus::Success), "{done:?}");
    }
}

#[test]
fn write_outside_the_region_is_terminated_and_nothing_outside_changes() {
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let src = Guarded::new(&a, 512, Access::LOCAL_WRITE, 0x11);
    let dst = Guarded::new(&b, 256, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    // 100 bytes that would end 44 bytes past the region.
    a.stream
        .post_send(write_wr(3, src.sge(0, 100), &dst, 200))
        .unwrap();
    pump(&mut a, &mut b, 7);
    assert!(dst.guards_intact(), "nothing outside the region changed");
    assert!(
        dst.data().iter().all(|&x| x == 0),
        "nothing inside changed either: the check precedes placement"
    );
    let code = TermCode::ddp_tagged(DdpTaggedErrorCode::BaseBounds);
    assert_eq!(
        b.stream.last_terminate(),
        Some(code),
        "the target answers with the RFC 5041 code"
    );
    assert_eq!(b.stream.state(), QpState::Error);
    assert_eq!(
        a.stream.last_terminate(),
        Some(code),
        "the initiator received that Terminate"
    );
    assert_eq!(a.stream.state(), QpState::Error);
    a.stream
        .post_send(SendWr {
            wr_id: 4,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sges: [].into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
    let wcs = drain(&a.scq);
    assert_eq!(
        wcs.last().map(|w| (w.wr_id, w.status)),
        Some((4, WcStatus::WrFlushErr))
    );
}

#[test]
fn read_with_a_bad_stag_completes_with_rem_access_err() {
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let src = Guarded::new(&b, 64, Access::REMOTE_READ, 1);
    let sink = Guarded::new(&a, 64, Access::LOCAL_WRITE, 0);
    let wr = SendWr {
        wr_id: 5,
        op: SendOp::Read {
            remote_addr: src.addr(),
            rkey: Stag(src.stag().0 ^ 0x5555),
        },
        sges: [sink.sge(0, 64)].into(),
        signaled: true,
        fence: false,
    };
    a.stream.post_send(wr).unwrap();
    pump(&mut a, &mut b, 64);
    assert_eq!(
        b.stream.last_terminate(),
        Some(TermCode::rdmap(
            RdmapErrorType::RemoteProtection,
            RdmapErrorCode::InvalidStag
        ))
    );
    let wcs = drain(&a.scq);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::RemAccessErr));
    assert!(sink.data().iter().all(|&x| x == 0));
}

#[test]
fn a_write_to_a_read_only_region_is_an_access_violation() {
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let src = Guarded::new(&a, 16, Access::LOCAL_WRITE, 9);
    let dst = Guarded::new(&b, 16, Access::REMOTE_READ, 0);
    a.stream
        .post_send(SendWr {
            wr_id: 6,
            op: SendOp::Write {
                remote_addr: dst.addr(),
                rkey: dst.stag(),
            },
            sges: [src.sge(0, 16)].into(),
            signaled: false,
            fence: false,
        })
        .unwrap();
    pump(&mut a, &mut b, 5);
    assert_eq!(
        b.stream.last_terminate(),
        Some(TermCode::rdmap(
            RdmapErrorType::RemoteProtection,
            RdmapErrorCode::AccessRights
        ))
    );
    assert!(dst.data().iter().all(|&x| x == 0) && dst.guards_intact());
}

#[test]
fn a_send_with_no_receive_posted_is_terminated() {
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let src = Guarded::new(&a, 16, Access::LOCAL_WRITE, 9);
    a.stream
        .post_send(SendWr {
            wr_id: 8,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sges: [src.sge(0, 16)].into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
    pump(&mut a, &mut b, 16);
    assert_eq!(
        b.stream.last_terminate(),
        Some(TermCode::ddp_untagged(DdpUntaggedErrorCode::NoBuffer))
    );
    assert_eq!(a.stream.state(), QpState::Error);
}

#[test]
fn a_corrupted_fpdu_fails_the_crc() {
    let (mut a, mut b) = (side(1, true, 4), side(2, true, 4));
    let src = Guarded::new(&a, 100, Access::LOCAL_WRITE, 3);
    let dst = Guarded::new(&b, 100, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    a.stream
        .post_send(write_wr(9, src.sge(0, 100), &dst, 0))
        .unwrap();
    let mut bytes = listed(&mut a.stream, 64);
    bytes[40] ^= 0x80; // inside the payload
    b.stream.rx_feed(&bytes);
    assert_eq!(
        b.stream.last_terminate(),
        Some(TermCode::mpa(MpaErrorCode::Crc))
    );
    assert_eq!(b.stream.state(), QpState::Error);
    let _ = &b.dev;
}

#[test]
fn send_with_invalidate_kills_the_named_stag() {
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let exposed = Guarded::new(&b, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    let dst = Guarded::new(&b, 64, Access::LOCAL_WRITE, 0);
    let src = Guarded::new(&a, 64, Access::LOCAL_WRITE, 4);
    b.stream
        .post_recv(RecvWr {
            wr_id: 1,
            sges: [dst.sge(0, 64)].into(),
        })
        .unwrap();
    a.stream
        .post_send(SendWr {
            wr_id: 2,
            op: SendOp::Send {
                solicited: true,
                invalidate: Some(exposed.stag()),
            },
            sges: [src.sge(0, 8)].into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
    pump(&mut a, &mut b, 9);
    let rc = drain(&b.rcq);
    assert_eq!(rc[0].status, WcStatus::Success);
    assert!(rc[0].solicited, "a Send with SE is marked solicited");
    assert_eq!(
        rc[0].invalidated,
        Some(exposed.stag().0),
        "the completion names the invalidated STag"
    );
    // A later Write to the invalidated STag is refused.
    a.stream
        .post_send(write_wr(3, src.sge(0, 8), &exposed, 0))
        .unwrap();
    pump(&mut a, &mut b, 9);
    assert_eq!(
        b.stream.last_terminate(),
        Some(TermCode::ddp_tagged(DdpTaggedErrorCode::InvalidStag))
    );
    assert!(exposed.data().iter().all(|&x| x == 0));
}

fn atomic_wr(wr_id: u64, op: SendOp, sink: &Guarded) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges: [sink.sge(0, 8)].into(),
        signaled: true,
        fence: false,
    }
}

#[test]
fn atomics_from_two_connections_under_contention_give_the_exact_count() {
    // One target device with two connections to it; both hammer the same word.
    let target_dev = Device::new();
    let tpd = target_dev.alloc_pd();
    let mk_target = |qp| {
        let (scq, rcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
        let cfg = StreamConfig {
            qp_num: qp,
            pd: tpd.id(),
            crc: false,
            mulpdu: 1024,
            ird: 8,
            ord: 8,
            remote_completion: false,
        };
        Side {
            dev: target_dev.clone(),
            pd: tpd.clone_handle(),
            scq: scq.clone(),
            rcq: rcq.clone(),
            stream: Stream::new(target_dev.clone(), cfg, scq, rcq),
        }
    };
    let (mut t1, mut t2) = (mk_target(10), mk_target(11));
    let word = Guarded::new(&t1, 64, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC, 0);
    let (mut a, mut b) = (side(1, false, 8), side(2, false, 8));
    let (sa, sb) = (
        Guarded::new(&a, 8, Access::LOCAL_WRITE, 0),
        Guarded::new(&b, 8, Access::LOCAL_WRITE, 0),
    );
    const N: u64 = 500;
    let mut originals = Vec::new();
    for i in 0..N {
        a.stream
            .post_send(atomic_wr(
                i,
                SendOp::FetchAdd {
                    remote_addr: word.addr() + 8,
                    rkey: word.stag(),
                    add: 1,
                },
                &sa,
            ))
            .unwrap();
        b.stream
            .post_send(atomic_wr(
                i,
                SendOp::FetchAdd {
                    remote_addr: word.addr() + 8,
                    rkey: word.stag(),
                    add: 1,
                },
                &sb,
            ))
            .unwrap();
        // Local CPU atomics on the same word interleave with the remote ones.
        // SAFETY: the word is 8-byte aligned inside a live buffer; accessed only atomically.
        unsafe { &*((word.addr() + 8) as *const std::sync::atomic::AtomicU64) }
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        pump(&mut a, &mut t1, 13);
        pump(&mut b, &mut t2, 29);
        for side in [&a, &b] {
            for wc in drain(&side.scq) {
                assert_eq!(
                    (wc.status, wc.opcode, wc.byte_len),
                    (WcStatus::Success, WcOpcode::FetchAdd, 8)
                );
                originals.push(wc.wr_id);
            }
        }
    }
    // SAFETY: as above.
    let final_value = unsafe { &*((word.addr() + 8) as *const std::sync::atomic::AtomicU64) }
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        final_value,
        3 * N,
        "every remote and local increment counted exactly once"
    );
    assert_eq!(originals.len() as u64, 2 * N);
    assert!(word.guards_intact());
    assert!(
        word.data()[..8]
            .iter()
            .chain(&word.data()[16..])
            .all(|&x| x == 0),
        "neighbouring words untouched"
    );
}

#[test]
fn cmpswap_and_swap_return_the_original_and_respect_the_comparison() {
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let word = Guarded::new(&b, 8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC, 0);
    let sink = Guarded::new(&a, 8, Access::LOCAL_WRITE, 0);
    let read_sink = || u64::from_ne_bytes(sink.data()[..8].try_into().unwrap());
    let read_word = || u64::from_ne_bytes(word.data()[..8].try_into().unwrap());
    let ops = [
        (
            SendOp::CmpSwap {
                remote_addr: word.addr(),
                rkey: word.stag(),
                compare: 0,
                swap: 42,
            },
            0,
            42,
        ),
        (
            SendOp::CmpSwap {
                remote_addr: word.addr(),
                rkey: word.stag(),
                compare: 7,
                swap: 99,
            },
            42,
            42,
        ), // mismatch: unchanged
        (
            SendOp::Swap {
                remote_addr: word.addr(),
                rkey: word.stag(),
                swap: 5,
            },
            42,
            5,
        ),
    ];
    for (i, (op, original, after)) in ops.into_iter().enumerate() {
        a.stream.post_send(atomic_wr(i as u64, op, &sink)).unwrap();
        pump(&mut a, &mut b, 11);
        let wc = drain(&a.scq);
        assert_eq!(
            (wc[0].status, wc[0].opcode),
            (WcStatus::Success, WcOpcode::CompSwap)
        );
        assert_eq!(read_sink(), original, "op {i} returns the original value");
        assert_eq!(read_word(), after, "op {i} leaves the word at {after}");
    }
}

#[test]
fn atomics_need_remote_atomic_rights_and_alignment() {
    for (access, offset, code) in [
        (
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            0,
            TermCode::rdmap(
                RdmapErrorType::RemoteProtection,
                RdmapErrorCode::AccessRights,
            ),
        ),
        (
            Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
            4,
            TermCode::rdmap(RdmapErrorType::RemoteProtection, RdmapErrorCode::BaseBounds),
        ),
    ] {
        let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
        let word = Guarded::new(&b, 16, access, 0);
        let sink = Guarded::new(&a, 8, Access::LOCAL_WRITE, 0);
        a.stream
            .post_send(atomic_wr(
                1,
                SendOp::FetchAdd {
                    remote_addr: word.addr() + offset,
                    rkey: word.stag(),
                    add: 1,
                },
                &sink,
            ))
            .unwrap();
        pump(&mut a, &mut b, 8);
        assert_eq!(b.stream.last_terminate(), Some(code));
        let wc = drain(&a.scq);
        assert_eq!(
            (wc[0].status, wc[0].opcode),
            (WcStatus::RemAccessErr, WcOpcode::FetchAdd)
        );
        assert!(word.data().iter().all(|&x| x == 0) && word.guards_intact());
    }
}

#[test]
fn write_with_immediate_completes_a_receive_after_the_data_landed() {
    let (mut a, mut b) = (side(1, true, 4), side(2, true, 4));
    let src = Guarded::new(&a, 3000, Access::LOCAL_WRITE, 0x77);
    let dst = Guarded::new(&b, 3000, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    b.stream
        .post_recv(RecvWr {
            wr_id: 55,
            sges: [].into(),
        })
        .unwrap();
    a.stream
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::WriteWithImm {
                remote_addr: dst.addr(),
                rkey: dst.stag(),
                imm: 0xC0FFEE,
            },
            sges: [src.sge(0, 3000)].into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
    pump(&mut a, &mut b, 100);
    let rc = drain(&b.rcq);
    assert_eq!(
        (rc[0].wr_id, rc[0].opcode, rc[0].imm),
        (55, WcOpcode::RecvRdmaWithImm, Some(0xC0FFEE))
    );
    assert!(dst.data().iter().all(|&x| x == 0x77));
    assert_eq!(drain(&a.scq)[0].opcode, WcOpcode::RdmaWrite);
}

#[test]
fn a_fenced_send_waits_for_the_read_before_it_and_carries_its_data() {
    for fence in [false, true] {
        let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
        let remote = Guarded::new(&b, 64, Access::LOCAL_WRITE | Access::REMOTE_READ, 0x42);
        let inbox = Guarded::new(&b, 64, Access::LOCAL_WRITE, 0);
        let local = Guarded::new(&a, 64, Access::LOCAL_WRITE, 0);
        b.stream
            .post_recv(RecvWr {
                wr_id: 1,
                sges: [inbox.sge(0, 64)].into(),
            })
            .unwrap();
        a.stream
            .post_send(SendWr {
                wr_id: 1,
                op: SendOp::Read {
                    remote_addr: remote.addr(),
                    rkey: remote.stag(),
                },
                sges: [local.sge(0, 64)].into(),
                signaled: true,
                fence: false,
            })
            .unwrap();
        a.stream
            .post_send(SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sges: [local.sge(0, 64)].into(),
                signaled: true,
                fence,
            })
            .unwrap();
        pump(&mut a, &mut b, 64);
        let got_read_data = inbox.data().iter().all(|&x| x == 0x42);
        assert_eq!(
            got_read_data, fence,
            "fence={fence}: the Send carries the Read's data only when fenced"
        );
        let order: Vec<u64> = drain(&a.scq).iter().map(|w| w.wr_id).collect();
        assert_eq!(order.len(), 2);
    }
}

#[test]
fn local_invalidate_kills_the_stag_in_order() {
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let exposed = Guarded::new(&b, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    let src = Guarded::new(&a, 64, Access::LOCAL_WRITE, 5);
    b.stream
        .post_send(SendWr {
            wr_id: 9,
            op: SendOp::LocalInvalidate {
                stag: exposed.stag(),
            },
            sges: [].into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
    let wc = drain(&b.scq);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (9, WcStatus::Success, WcOpcode::LocalInv)
    );
    a.stream
        .post_send(write_wr(1, src.sge(0, 8), &exposed, 0))
        .unwrap();
    pump(&mut a, &mut b, 16);
    assert_eq!(
        b.stream.last_terminate(),
        Some(TermCode::ddp_tagged(DdpTaggedErrorCode::InvalidStag))
    );
    assert!(exposed.data().iter().all(|&x| x == 0));
}

#[test]
fn a_peer_exceeding_the_negotiated_ird_is_terminated() {
    // A misbehaving initiator whose ORD (8) exceeds the target's IRD (4).
    let (mut a, mut b) = (side(1, false, 8), side(2, false, 4));
    let src = Guarded::new(&b, 64, Access::REMOTE_READ, 1);
    let sink = Guarded::new(&a, 6 * 8, Access::LOCAL_WRITE, 0);
    for i in 0..6u64 {
        let wr = SendWr {
            wr_id: i,
            op: SendOp::Read {
                remote_addr: src.addr(),
                rkey: src.stag(),
            },
            sges: [sink.sge(i as usize * 8, 8)].into(),
            signaled: true,
            fence: false,
        };
        a.stream.post_send(wr).unwrap();
    }
    pump(&mut a, &mut b, 4096);
    assert_eq!(
        b.stream.last_terminate(),
        Some(TermCode::rdmap(
            RdmapErrorType::RemoteOperation,
            RdmapErrorCode::CatastrophicStream
        ))
    );
    let wcs = drain(&a.scq);
    assert!(
        wcs.iter().any(|w| w.status == WcStatus::RemOpErr),
        "{wcs:?}"
    );
}

#[test]
fn send_queue_completions_come_in_posting_order() {
    // Completions follow the posting order, as verbs requires, whatever mix of operations was
    // posted: with remote completion because the peer answers in order, with local completion
    // because a Write finished early waits for the Read posted before it.
    for remote_completion in [true, false] {
        let (mut a, mut b) = (
            side_with(1, false, 4, remote_completion, 1024),
            side_with(2, false, 4, remote_completion, 1024),
        );
        let remote = Guarded::new(
            &b,
            4096,
            Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            0,
        );
        let inbox = Guarded::new(&b, 64, Access::LOCAL_WRITE, 0);
        let local = Guarded::new(&a, 4096, Access::LOCAL_WRITE, 3);
        b.stream
            .post_recv(RecvWr {
                wr_id: 100,
                sges: [inbox.sge(0, 64)].into(),
            })
            .unwrap();
        let ops = [
            (
                SendOp::Write {
                    remote_addr: remote.addr(),
                    rkey: remote.stag(),
                },
                local.sge(0, 2000),
                WcOpcode::RdmaWrite,
            ),
            (
                SendOp::Read {
                    remote_addr: remote.addr() + 2048,
                    rkey: remote.stag(),
                },
                local.sge(2048, 1000),
                WcOpcode::RdmaRead,
            ),
            (
                SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                local.sge(0, 32),
                WcOpcode::Send,
            ),
            (
                SendOp::FetchAdd {
                    remote_addr: remote.addr() + 4088,
                    rkey: remote.stag(),
                    add: 1,
                },
                local.sge(4088, 8),
                WcOpcode::FetchAdd,
            ),
            (
                SendOp::Write {
                    remote_addr: remote.addr() + 3000,
                    rkey: remote.stag(),
                },
                local.sge(0, 10),
                WcOpcode::RdmaWrite,
            ),
        ];
        let expect: Vec<(u64, WcOpcode)> = ops
            .iter()
            .enumerate()
            .map(|(i, o)| (i as u64, o.2))
            .collect();
        for (i, (op, sge, _)) in ops.into_iter().enumerate() {
            a.stream
                .post_send(SendWr {
                    wr_id: i as u64,
                    op,
                    sges: [sge].into(),
                    signaled: true,
                    fence: false,
                })
                .unwrap();
        }
        pump(&mut a, &mut b, 97);
        let got: Vec<(u64, WcOpcode)> = drain(&a.scq)
            .iter()
            .map(|w| {
                assert_eq!(w.status, WcStatus::Success);
                (w.wr_id, w.opcode)
            })
            .collect();
        assert_eq!(got, expect);
        assert!(
            remote.data()[..2000].iter().all(|&x| x == 3),
            "the first Write landed before it completed"
        );
    }
}

/// A close (`enter_error`) while an asynchronous send has taken several chunks keeps those
/// chunks, so the send's completion settles exactly the bytes it sent and the peer receives
/// whole FPDUs; what no send had taken is flushed. (Before, the close kept only a started front
/// chunk, and the completion advanced past the queue: a panic in the io_uring path, seen in
/// the soak.)
#[test]
fn a_close_while_a_send_is_in_flight_keeps_the_chunks_it_took() {
    let (mut a, mut b) = (side(1, true, 4), side(2, true, 4));
    let src = Guarded::new(&a, 5000, Access::LOCAL_WRITE, 0x5A);
    let dst = Guarded::new(&b, 8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    for k in 0..3u64 {
        a.stream
            .post_send(write_wr(k, src.sge(0, 1500), &dst, 2000 * k))
            .unwrap();
    }
    // An asynchronous send takes what the first two Writes queued (several FPDUs each).
    let all: Vec<u8> = listed(&mut a.stream, 64);
    let taken = all.len() * 2 / 3;
    a.stream.tx_take(taken);
    a.stream.enter_error(WcStatus::WrFlushErr);
    // Its completion: all of it went.
    a.stream.tx_settle(taken);
    // What it took reaches the peer as whole FPDUs (the rest of a started one follows).
    let rest: Vec<u8> = listed(&mut a.stream, 64);
    a.stream.tx_advance(rest.len());
    let mut wire = all[..taken].to_vec();
    wire.extend_from_slice(&rest);
    assert_eq!(
        b.stream.rx_feed(&wire),
        wire.len(),
        "the peer took every byte"
    );
    assert_eq!(
        b.stream.state(),
        QpState::Rts,
        "no framing error at the peer"
    );
    assert!(
        dst.data()[..1500].iter().all(|&x| x == 0x5A),
        "the first Write landed"
    );
    assert!(dst.guards_intact());
    assert!(!a.stream.wants_tx());
}

/// Two sides, and side `a`'s one posted Write (wr_id 1) of `len` bytes of `fill` to the start
/// of a region of `b`'s, nothing sent yet.
fn one_write(crc: bool, len: usize, fill: u8) -> (Side, Side, Guarded, Guarded) {
    let (mut a, b) = (side(1, crc, 4), side(2, crc, 4));
    let src = Guarded::new(&a, len, Access::LOCAL_WRITE, fill);
    let dst = Guarded::new(&b, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    a.stream
        .post_send(write_wr(1, src.sge(0, len), &dst, 0))
        .unwrap();
    (a, b, src, dst)
}

/// Where each FPDU of `wire` ends (MPA: a 16-bit ULPDU length, the ULPDU, padding to four
/// bytes, and a 4-byte CRC field).
fn fpdu_ends(wire: &[u8]) -> Vec<usize> {
    let (mut at, mut ends) = (0, Vec::new());
    while at + 2 <= wire.len() {
        let ulpdu = u16::from_be_bytes([wire[at], wire[at + 1]]) as usize;
        at += (2 + ulpdu).div_ceil(4) * 4 + 4;
        ends.push(at);
    }
    ends
}

/// A Write of many FPDUs takes two gather entries per FPDU, plus the last trailer: each
/// trailer shares its entry with the next FPDU's header. The peer reads the bytes as the same
/// FPDUs, with and without CRC.
#[test]
fn a_segmented_write_takes_two_gather_entries_per_fpdu() {
    for crc in [false, true] {
        let (mut a, mut b, _src, dst) = one_write(crc, 9000, 0x3C);
        let mut iov = [std::io::IoSlice::new(&[]); 64];
        let n = a.stream.tx_iovecs(&mut iov);
        let wire: Vec<u8> = iov[..n].iter().flat_map(|s| s.iter().copied()).collect();
        let fpdus = fpdu_ends(&wire);
        assert_eq!(fpdus.last(), Some(&wire.len()), "crc {crc}: whole FPDUs");
        assert!(
            fpdus.len() >= 9,
            "crc {crc}: segmented ({} FPDUs)",
            fpdus.len()
        );
        assert_eq!(n, 2 * fpdus.len() + 1, "crc {crc}: gather entries");
        a.stream.tx_advance(wire.len());
        assert_eq!(b.stream.rx_feed(&wire), wire.len(), "crc {crc}");
        assert_eq!(
            b.stream.state(),
            QpState::Rts,
            "crc {crc}: no framing error"
        );
        assert!(dst.data().iter().all(|&x| x == 0x3C), "crc {crc}: landed");
        assert!(dst.guards_intact());
        assert_eq!(drain(&a.scq).len(), 1, "crc {crc}: the Write completed");
    }
}

/// A close while a send is in flight finishes the FPDU that send started and no more: when the
/// send stopped inside a trailer whose gather entry also holds the next FPDU's header, that
/// header is not sent, so the peer's stream ends on an FPDU boundary.
#[test]
fn a_close_inside_a_trailer_does_not_start_the_next_fpdu() {
    let (mut a, mut b, _src, dst) = one_write(false, 3000, 0x77);
    let all = listed(&mut a.stream, 64);
    let first = fpdu_ends(&all)[0];
    // The send stopped two bytes before the first FPDU's end, inside its CRC field.
    let taken = first - 2;
    a.stream.tx_take(taken);
    a.stream.enter_error(WcStatus::WrFlushErr);
    a.stream.tx_settle(taken);
    let rest = listed(&mut a.stream, 64);
    a.stream.tx_advance(rest.len());
    assert!(!a.stream.wants_tx());
    let mut wire = all[..taken].to_vec();
    wire.extend_from_slice(&rest);
    assert_eq!(
        wire.len(),
        first,
        "the stream ends where the first FPDU does"
    );
    assert_eq!(b.stream.rx_feed(&wire), wire.len());
    assert_eq!(
        b.stream.state(),
        QpState::Rts,
        "no framing error at the peer"
    );
    let landed = dst.data().iter().take_while(|&&x| x == 0x77).count();
    assert!(
        landed > 0 && landed < 3000,
        "the first FPDU landed ({landed} bytes)"
    );
    assert!(dst.data()[landed..].iter().all(|&x| x == 0));
    assert!(dst.guards_intact());
}

/// A Terminate that follows a send which stopped between an FPDU's header and its payload
/// (the last entry of a full gather list, say) reaches the peer intact: the close finishes
/// that FPDU first, so the Terminate starts on an FPDU boundary. (Before, the close dropped
/// the payload and trailer, and the peer read the Terminate's bytes as the rest of the Write's
/// FPDU.)
#[test]
fn a_terminate_after_a_send_that_stopped_at_a_header_reaches_the_peer() {
    for crc in [false, true] {
        let (mut a, mut b, _src, dst) = one_write(crc, 3000, 0x42);
        // The socket took exactly the first gather entry: the first FPDU's header.
        let head = listed(&mut a.stream, 1);
        a.stream.tx_advance(head.len());
        // b writes outside any region of a's: a answers with a Terminate.
        let bad = Guarded::new(&b, 64, Access::LOCAL_WRITE, 0x17);
        let b_src = bad.sge(0, 8);
        b.stream
            .post_send(SendWr {
                wr_id: 9,
                op: SendOp::Write {
                    remote_addr: 0x1000,
                    rkey: Stag(0xdead_0000),
                },
                sges: [b_src].into(),
                signaled: true,
                fence: false,
            })
            .unwrap();
        let mut round = 0;
        transfer(&mut b, &mut a, 5, &mut round);
        assert!(a.stream.terminate_sent(), "crc {crc}: a refused the Write");
        let mut wire = head;
        while a.stream.wants_tx() {
            let bytes = listed(&mut a.stream, 64);
            a.stream.tx_advance(bytes.len());
            wire.extend_from_slice(&bytes);
        }
        assert_eq!(
            fpdu_ends(&wire).last(),
            Some(&wire.len()),
            "crc {crc}: whole FPDUs"
        );
        b.stream.rx_feed(&wire);
        assert!(
            b.stream.peer_terminated(),
            "crc {crc}: b read the Terminate"
        );
        assert_eq!(
            b.stream.last_terminate(),
            a.stream.last_terminate(),
            "crc {crc}: with a's code"
        );
        assert!(dst.guards_intact());
    }
}

/// A close when a send stopped exactly where a joined chunk's trailer ends (the next FPDU's
/// header not sent) leaves nothing to send: the chunk, cut back to its trailer, is done.
/// (Before, the cut left a chunk of zero bytes to go at the front, and the stream asked for a
/// send forever.)
#[test]
fn a_close_at_the_end_of_a_trailer_leaves_nothing_to_send() {
    let (mut a, mut b, _src, _dst) = one_write(false, 3000, 0x77);
    let all = listed(&mut a.stream, 64);
    let first = fpdu_ends(&all)[0];
    a.stream.tx_advance(first);
    a.stream.enter_error(WcStatus::WrFlushErr);
    assert!(!a.stream.wants_tx(), "nothing left to send");
    assert_eq!(b.stream.rx_feed(&all[..first]), first);
    assert_eq!(b.stream.state(), QpState::Rts);
}

/// A gather entry of length 0 is valid, and puts no empty slice into what the stream sends: a
/// send whose gather list held only empty slices would move nothing and report 0 bytes.
#[test]
fn an_empty_gather_entry_sends_no_empty_slice() {
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let src = Guarded::new(&a, 3000, Access::LOCAL_WRITE, 0x29);
    let dst = Guarded::new(&b, 3000, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    let sges = [src.sge(0, 1000), src.sge(1000, 0), src.sge(1000, 2000)];
    a.stream
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: dst.addr(),
                rkey: dst.stag(),
            },
            sges: sges.into_iter().collect(),
            signaled: true,
            fence: false,
        })
        .unwrap();
    let mut iov = [std::io::IoSlice::new(&[]); 64];
    let n = a.stream.tx_iovecs(&mut iov);
    assert!(
        iov[..n].iter().all(|s| !s.is_empty()),
        "an empty slice among {:?}",
        iov[..n].iter().map(|s| s.len()).collect::<Vec<_>>()
    );
    pump(&mut a, &mut b, 50);
    assert!(dst.data().iter().all(|&x| x == 0x29), "landed");
    assert_eq!(drain(&a.scq)[0].status, WcStatus::Success);
}

/// A completion queue with no room loses a completion. The queue pair then stops (ERROR, and a
/// Terminate tells the peer) rather than carry on with work it can no longer report: on the
/// send side, and on the receive side.
#[test]
fn an_overrun_completion_queue_stops_its_queue_pair_and_tells_the_peer() {
    let overrun = TermCode::rdmap(
        RdmapErrorType::LocalCatastrophic,
        RdmapErrorCode::CatastrophicStream,
    );
    // Send side: 70 signaled WRITEs, and nobody polls a's send queue (it holds 64).
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let src = Guarded::new(&a, 16, Access::LOCAL_WRITE, 1);
    let dst = Guarded::new(&b, 16 * 70, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    for i in 0..70 {
        a.stream
            .post_send(write_wr(i, src.sge(0, 16), &dst, i * 16))
            .unwrap();
    }
    pump(&mut a, &mut b, 4096);
    let wcs = drain(&a.scq);
    assert_eq!(wcs.len(), 64);
    assert!(wcs
        .iter()
        .enumerate()
        .all(|(i, wc)| wc.wr_id == i as u64 && wc.status == WcStatus::Success));
    assert_eq!(a.stream.state(), QpState::Error);
    assert_eq!(a.stream.last_terminate(), Some(overrun));
    assert!(b.stream.peer_terminated());
    assert_eq!(b.stream.last_terminate(), Some(overrun));
    assert_eq!(b.stream.state(), QpState::Error);
    // With room again, work posted now completes, as a flush.
    a.stream
        .post_send(write_wr(99, src.sge(0, 16), &dst, 0))
        .unwrap();
    let wcs = drain(&a.scq);
    assert_eq!(
        (wcs.len(), wcs[0].wr_id, wcs[0].status),
        (1, 99, WcStatus::WrFlushErr)
    );
    assert!(dst.guards_intact());

    // Receive side: 70 unsignaled SENDs into 70 receives, and nobody polls b's receive queue.
    let (mut a, mut b) = (side(1, false, 4), side(2, false, 4));
    let src = Guarded::new(&a, 16, Access::LOCAL_WRITE, 2);
    let dst = Guarded::new(&b, 16 * 70, Access::LOCAL_WRITE, 0);
    for i in 0..70 {
        b.stream
            .post_recv(RecvWr {
                wr_id: i,
                sges: [dst.sge(i as usize * 16, 16)].into(),
            })
            .unwrap();
        a.stream
            .post_send(SendWr {
                wr_id: 100 + i,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sges: [src.sge(0, 16)].into(),
                signaled: false,
                fence: false,
            })
            .unwrap();
    }
    pump(&mut a, &mut b, 4096);
    let wcs = drain(&b.rcq);
    assert_eq!(wcs.len(), 64);
    assert!(wcs
        .iter()
        .enumerate()
        .all(|(i, wc)| wc.wr_id == i as u64 && wc.status == WcStatus::Success));
    assert_eq!(b.stream.state(), QpState::Error);
    assert_eq!(b.stream.last_terminate(), Some(overrun));
    assert!(a.stream.peer_terminated());
    assert_eq!(a.stream.state(), QpState::Error);
    assert!(dst.guards_intact());
}
