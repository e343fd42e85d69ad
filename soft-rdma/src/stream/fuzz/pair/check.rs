//! The promises of the module doc, checked on both sides once a script has run.

use super::*;

/// Every check of the module doc, on both directions.
pub(super) fn check(sides: &[Side; 2]) -> Tally {
    // An altered stream relaxes what a close relaxes: either side may have stopped.
    let closed = sides.iter().any(|s| s.closed || s.corrupted);
    let mut tally = Tally {
        closes: sides.iter().filter(|s| s.closed).count(),
        corrupted: sides.iter().filter(|s| s.corrupted).count(),
        ..Tally::default()
    };
    for (i, s) in sides.iter().enumerate() {
        tally.fpdus += whole_fpdus(&s.wire, s.stream.cfg.crc, i);
        let peer = &sides[1 - i];
        if !closed {
            assert_eq!(s.stream.state(), QpState::Rts, "side {i} left RTS");
        }
        untouched(s, peer, i);
        terminate_heard(s, peer, i, &mut tally);
        if s.corrupted {
            // What the peer did with this side's altered requests is not theirs to model.
            in_order(s, i);
            continue;
        }
        requests(s, peer, i, closed, &mut tally);
        tally.invalidations += receives(peer, s, 1 - i, closed);
        target(s, peer, i, closed);
    }
    tally
}

/// A Terminate `s` sent reached its peer intact, with its code: unless the peer had closed,
/// or had stopped at a violation of its own first.
fn terminate_heard(s: &Side, peer: &Side, side: usize, tally: &mut Tally) {
    if s.stream.terminate_sent() && !s.stream.peer_terminated() {
        tally.terminates += 1;
        if !peer.closed && !peer.stream.terminate_sent() {
            assert!(
                peer.stream.peer_terminated(),
                "side {side}'s Terminate did not reach its peer"
            );
            assert_eq!(
                peer.stream.last_terminate(),
                s.stream.last_terminate(),
                "side {side}'s Terminate reached its peer with another code"
            );
        }
    }
}

/// The side no longer takes what its peer sends: it closed, or its receiving stopped (at a
/// violation, or at the peer's Terminate).
fn stopped(s: &Side) -> bool {
    s.closed || s.stream.rx_dead()
}

/// `s`'s send completions come once each, in posting order, with their own opcodes.
fn in_order(s: &Side, side: usize) {
    let mut next = 0;
    for wc in &s.wcs {
        let id = wc.wr_id as usize;
        assert!(
            id >= next && id < s.ops.len(),
            "side {side}: completion {id} out of order (next {next}) or unknown"
        );
        assert_eq!(
            wc.opcode, s.ops[id].opcode,
            "side {side}: request {id}'s opcode"
        );
        next = id + 1;
    }
}

/// The wire is whole FPDUs (with good CRCs where on); how many.
fn whole_fpdus(wire: &[u8], crc: bool, side: usize) -> usize {
    let mut d = Deframer::new(crc, u16::MAX as usize);
    let mut n = 0;
    d.feed(wire, |_| {
        n += 1;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("side {side}'s wire does not frame: {e:?}"));
    assert_eq!(
        d.buffered(),
        0,
        "side {side}'s wire ends inside an FPDU ({} bytes, {n} whole FPDUs)",
        wire.len()
    );
    n
}

/// Nothing outside what the peer may change has changed in `s`'s memory.
fn untouched(s: &Side, peer: &Side, side: usize) {
    let mem = s.mem();
    let mut open = vec![false; MEM];
    let mut mark = |off: usize, len: usize| open[off..off + len].fill(true);
    mark(DST, DST_LEN);
    for o in &s.ops {
        match o.effect {
            Effect::Read { sink, len, .. } => mark(sink, len),
            Effect::Atomic { sink, .. } => mark(sink, 8),
            _ => {}
        }
    }
    // Altered requests, or altered responses from the peer, may name any offset of the sinks
    // and any receive; never a guard byte, the source or a gap between receive buffers.
    if s.corrupted || peer.corrupted {
        mark(SINK, SINK_LEN);
    }
    let used = if peer.corrupted {
        RECVS
    } else {
        peer.ops.iter().filter(|o| o.effect.takes_receive()).count()
    };
    for j in 0..used {
        for (off, len) in recv_buffers(j) {
            mark(off, len);
        }
    }
    for (k, (&now, &open)) in mem.iter().zip(&open).enumerate() {
        if open {
            continue;
        }
        let was = if (SRC..SRC + SRC_LEN).contains(&k) {
            pattern(side, k - SRC, 1)
        } else if (SINK..SINK + SINK_LEN).contains(&k) || (RBUF..RBUF + RECVS * RSLOT).contains(&k)
        {
            BLANK
        } else {
            GUARD_BYTE
        };
        assert_eq!(
            now, was,
            "side {side}: byte {k} changed, outside any area a peer may write"
        );
    }
}

/// `s`'s send completions: once each, in order, and what succeeded took effect.
fn requests(s: &Side, peer: &Side, side: usize, closed: bool, tally: &mut Tally) {
    in_order(s, side);
    for wc in &s.wcs {
        let id = wc.wr_id as usize;
        let op = &s.ops[id];
        if wc.status != WcStatus::Success {
            assert!(
                closed,
                "side {side}: request {id} failed ({:?}) with no close",
                wc.status
            );
            tally.flushed += 1;
            continue;
        }
        let mem = s.mem();
        match &op.effect {
            // Responses come in the peer's stream: altered, they prove nothing.
            Effect::Read { .. } | Effect::Atomic { .. } if peer.corrupted => {}
            Effect::Write { .. } => tally.writes += 1,
            Effect::Send { .. } => tally.sends += 1,
            Effect::Read {
                sink,
                len,
                versions,
                ..
            } => {
                tally.reads += 1;
                for k in 0..*len {
                    let got = mem[sink + k];
                    assert!(
                        versions.iter().any(|v| v[k] == got),
                        "side {side}: Read {id} byte {k} is {got:#04x}, which the peer's region \
                         never held there"
                    );
                }
            }
            Effect::Atomic { sink, original, .. } => {
                tally.atomics += 1;
                let got = u64::from_ne_bytes(mem[*sink..sink + 8].try_into().unwrap());
                assert_eq!(got, *original, "side {side}: atomic {id}'s original value");
            }
        }
    }
    if !closed {
        // In order and once each (above), so this many means every one.
        assert_eq!(
            s.wcs.len(),
            s.ops.len(),
            "side {side}: requests never completed"
        );
    }
}

/// `r`'s receive completions, for what `s` sent: in order; each successful one holds the Send's
/// bytes, event flag and invalidated STag (or the Write's immediate data). How many invalidated.
fn receives(r: &Side, s: &Side, side: usize, closed: bool) -> usize {
    let mut invalidations = 0;
    let sent: Vec<&Op> = s.ops.iter().filter(|o| o.effect.takes_receive()).collect();
    let mem = r.mem();
    let mut ok = 0;
    for (j, wc) in r.rwcs.iter().enumerate() {
        assert_eq!(
            wc.wr_id as usize, j,
            "side {side}: receives complete in order"
        );
        if wc.status != WcStatus::Success {
            assert!(
                closed,
                "side {side}: receive {j} failed ({:?}) with no close",
                wc.status
            );
            continue;
        }
        assert_eq!(ok, j, "side {side}: a receive succeeded after one failed");
        ok += 1;
        let op = sent
            .get(j)
            .unwrap_or_else(|| panic!("side {side}: receive {j} completed with nothing sent"));
        match &op.effect {
            Effect::Send {
                bytes,
                solicited,
                invalidate,
            } => {
                assert_eq!(
                    wc.opcode,
                    WcOpcode::Recv,
                    "side {side}: receive {j}'s opcode"
                );
                assert_eq!(wc.solicited, *solicited, "side {side}: receive {j}'s event");
                assert_eq!(
                    wc.invalidated, *invalidate,
                    "side {side}: receive {j}'s invalidated STag"
                );
                invalidations += usize::from(invalidate.is_some());
                assert_eq!(
                    wc.byte_len as usize,
                    bytes.len(),
                    "side {side}: receive {j}'s length"
                );
                let mut placed = Vec::new();
                for (off, len) in recv_buffers(j) {
                    placed.extend_from_slice(&mem[off..off + len]);
                }
                assert!(
                    placed[..bytes.len()] == bytes[..],
                    "side {side}: receive {j} does not hold the Send's bytes"
                );
            }
            Effect::Write { imm, .. } => {
                assert_eq!(
                    wc.opcode,
                    WcOpcode::RecvRdmaWithImm,
                    "side {side}: receive {j}"
                );
                assert_eq!(wc.imm, *imm, "side {side}: receive {j}'s immediate data");
                assert!(!wc.solicited, "side {side}: receive {j} asked for no event");
            }
            _ => unreachable!("only Sends and Writes with immediate data take receives"),
        }
    }
    // A Send that completed at its sender reached a receive, unless the receiver closed.
    if !stopped(r) {
        let acked = s
            .wcs
            .iter()
            .filter(|wc| wc.status == WcStatus::Success)
            .filter(|wc| s.ops[wc.wr_id as usize].effect.takes_receive())
            .count();
        assert!(
            ok >= acked,
            "side {side}: {acked} Sends completed, {ok} received"
        );
        if !closed {
            assert_eq!(ok, sent.len(), "side {side}: receives never completed");
        }
    }
    invalidations
}

/// The peer's target region holds what `s`'s requests, applied in posting order, leave there:
/// all of them with no close; with one, the requests before some point (at least every one
/// that completed, where the peer was there to take it), the last perhaps in part.
fn target(s: &Side, peer: &Side, side: usize, closed: bool) {
    let now = &peer.mem()[DST..DST + DST_LEN];
    if !closed {
        assert!(
            now == &s.model[..],
            "side {side}'s requests did not leave the peer's region as they should: first \
             difference at byte {:?}",
            now.iter().zip(&s.model).position(|(a, b)| a != b)
        );
        return;
    }
    let done = |wc: &&WorkCompletion| {
        wc.status == WcStatus::Success
            && (!stopped(peer)
                || matches!(
                    s.ops[wc.wr_id as usize].effect,
                    Effect::Read { .. } | Effect::Atomic { .. }
                ))
    };
    let from = s
        .wcs
        .iter()
        .filter(done)
        .map(|wc| wc.wr_id as usize + 1)
        .max()
        .unwrap_or(0);
    let fits = |p: usize| {
        let state = s.ops.get(p).map_or(&s.model, |o| &o.before);
        let Some(Op {
            effect: Effect::Write { off, bytes, .. },
            ..
        }) = s.ops.get(p)
        else {
            return now == &state[..];
        };
        let (off, end) = (*off, off + bytes.len());
        if now[..off] != state[..off] || now[end..] != state[end..] {
            return false;
        }
        // A prefix of the Write's bytes, then the region as it was.
        let m = now[off..end]
            .iter()
            .zip(bytes)
            .take_while(|(a, b)| a == b)
            .count();
        now[off + m..end] == state[off + m..end]
    };
    assert!(
        (from..=s.ops.len()).any(fits),
        "side {side}'s requests after a close: the peer's region is not what any prefix of \
         them (from request {from} on) leaves"
    );
}
