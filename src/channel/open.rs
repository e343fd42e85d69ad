//! Opening a channel: the handshake by control message that pairs both directions.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::rc::Rc;

use barewire_drivers::{Access, Buffer};
use bytemuck::Pod;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::ring::{extent, RxState};
use super::send::TxState;
use super::{
    credit_step, run_limit, Bare, Bytes, ChannelOptions, Codec, Raw, Receiver, Sender, Waiters,
};
use crate::control::{imm, Control};
use crate::endpoint::{ChanRef, Endpoint, Inner};
use crate::error::{Error, Result};
use crate::region::Fingerprint;

impl Endpoint {
    /// Opens a duplex channel of plain-old-data `T` with the peer, who calls this too: each
    /// side gets the sender of its direction and the receiver of the other. Channels pair up in
    /// the order both sides open them; a peer that opens a channel of another type (or codec)
    /// makes both calls fail with [`Error::TypeMismatch`].
    ///
    /// ```no_run
    /// # async fn demo(ep: barewire::Endpoint) -> barewire::Result<()> {
    /// let (tx, rx) = ep.open_channel::<[u64; 8]>(Default::default()).await?;
    /// tx.send(&[1; 8]).await?;
    /// let got: [u64; 8] = rx.recv().await?;
    /// # let _ = got; Ok(()) }
    /// ```
    pub async fn open_channel<T: Pod>(
        &self,
        opts: ChannelOptions,
    ) -> Result<(Sender<T, Raw>, Receiver<T, Raw>)> {
        self.open::<T, Raw>(opts).await
    }

    /// As [`open_channel`](Self::open_channel), for any serde type, BARE-encoded.
    pub async fn open_bare_channel<T: Serialize + DeserializeOwned>(
        &self,
        opts: ChannelOptions,
    ) -> Result<(Sender<T, Bare>, Receiver<T, Bare>)> {
        self.open::<T, Bare>(opts).await
    }

    /// As [`open_channel`](Self::open_channel), for messages that are opaque byte strings.
    pub async fn open_bytes_channel(
        &self,
        opts: ChannelOptions,
    ) -> Result<(Sender<Vec<u8>, Bytes>, Receiver<Vec<u8>, Bytes>)> {
        self.open::<Vec<u8>, Bytes>(opts).await
    }

    async fn open<T, C: Codec<T>>(
        &self,
        opts: ChannelOptions,
    ) -> Result<(Sender<T, C>, Receiver<T, C>)> {
        if opts.capacity == 0 || opts.max_message == 0 || opts.max_message > imm::MAX_MESSAGE {
            return Err(Error::Invalid(format!(
                "channel capacity {} and max_message {} (1..={})",
                opts.capacity,
                opts.max_message,
                imm::MAX_MESSAGE
            )));
        }
        let inner: &Rc<Inner> = self.inner();
        let fp = Fingerprint::of::<T>();
        let slot = extent(opts.max_message).next_multiple_of(8);
        let cap = opts.capacity as u64;

        // Our direction: a credit word the peer may write, receives for its credit notices.
        let credit = Buffer::new(
            &inner.pd,
            64,
            64,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let bytes = cap as usize * slot;
        let staging = Buffer::new(&inner.pd, bytes, 64, Access::LOCAL_WRITE).map_err(|e| {
            Error::Invalid(format!(
                "a channel of {cap} slots of {slot} bytes needs {bytes} bytes of staging on \
                 the sending side, which it could not have: {e}"
            ))
        })?;
        let id = inner.next_chan_id()?;
        let step = credit_step(cap, slot);
        let tx = Rc::new(TxState {
            id,
            capacity: cap,
            slot,
            credit: credit.clone(),
            ring: Cell::new(None),
            waker: Waiters::default(),
            link: Rc::downgrade(inner),
            staging,
            seq: Cell::new(0),
            head: Cell::new(0),
            posted: Cell::new(0),
            run_at: Cell::new(0),
            signal_at: Cell::new(step),
            run_limit: run_limit(cap, slot),
            step,
            last_len: Cell::new(0),
            listed: Cell::new(false),
            inflight: RefCell::new(VecDeque::new()),
            polled: Cell::new(false),
            direct: OnceCell::new(),
            wake_due: Cell::new(false),
            room_until: Cell::new(0),
            watching: Cell::new(false),
        });
        let tx_recvs = tx.recvs();
        if let Err(e) = inner.add_recvs(tx_recvs) {
            // The peer never heard of `id`.
            inner.free_chan_id(id);
            return Err(e);
        }
        inner
            .shared
            .borrow_mut()
            .chans
            .insert(id, ChanRef::Tx(Rc::downgrade(&tx)));
        // Which of the peer's Opens pairs with this one: taken only now, as the Open goes out,
        // so an open that failed here before sending anything (its buffers could not be had)
        // takes no place in the pairing, and the next one pairs where it would have.
        let index = inner.next_open_index();
        inner
            .send_control(&Control::Open {
                id,
                fp: fp.clone(),
                codec: C::ID,
                capacity: opts.capacity,
                slot: slot as u32,
                credit: credit.descriptor(),
            })
            .await?;

        // Their direction: the index-th Open the peer sent.
        let (pid, pfp, pcodec, pcap, pslot, pcredit) = inner
            .handshake("channel Open", |ord, c| match c {
                Control::Open {
                    id,
                    fp,
                    codec,
                    capacity,
                    slot,
                    credit,
                } if ord == index => Some((*id, fp.clone(), *codec, *capacity, *slot, *credit)),
                _ => None,
            })
            .await
            .map_err(|e| half_done(inner, e))?;
        let mismatch = fp.check(&pfp).err().or_else(|| {
            (pcodec != C::ID).then(|| {
                Error::type_mismatch(
                    format!("{fp} with codec {}", C::ID),
                    format!("{pfp} with codec {pcodec}"),
                )
            })
        });
        if let Some(e) = mismatch {
            return Err(refuse(inner, pid, id, tx_recvs, e).await);
        }
        // (`Control::decode` let through only Opens whose shape fits.)
        debug_assert!(super::ring_shape_fits(pcap, pslot));
        // The peer chose this ring's size: refuse one beyond the limit, or one that cannot be
        // had, rather than leave the peer's open waiting.
        let ring_bytes = pcap as usize * pslot as usize;
        if ring_bytes > inner.ring_limit.get() {
            let e = Error::Invalid(format!(
                "the peer's channel needs a ring of {pcap} slots of {pslot} bytes \
                 ({ring_bytes} bytes), beyond this side's limit of {} bytes \
                 (Endpoint::set_channel_ring_limit)",
                inner.ring_limit.get()
            ));
            return Err(refuse(inner, pid, id, tx_recvs, e).await);
        }
        let ring = match Buffer::new(
            &inner.pd,
            ring_bytes,
            64,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ) {
            Ok(ring) => ring,
            Err(e) => return Err(refuse(inner, pid, id, tx_recvs, e.into()).await),
        };
        // Watch the ring (it is zeroed) where the transport lets memory be watched: the
        // peer's WRITEs then land in ascending order and wake this core if it sleeps.
        let polled = !opts.announce && inner.ops.qp().watch_memory();
        let rx = Rc::new(RxState {
            id: pid,
            capacity: pcap as u64,
            slot: pslot as usize,
            ring: ring.clone(),
            arrived: Cell::new(0),
            closed: Cell::new(false),
            waker: Waiters::default(),
            polled,
            peer_stores: polled && inner.ops.qp().transport() == barewire_drivers::Transport::Shm,
            watch_at: Cell::new(0),
            watched: Cell::new(false),
        });
        let rx_recvs = rx.recvs();
        if let Err(e) = inner.add_recvs(rx_recvs) {
            return Err(refuse(inner, pid, id, tx_recvs, e).await);
        }
        inner
            .shared
            .borrow_mut()
            .chans
            .insert(pid, ChanRef::Rx(Rc::downgrade(&rx)));
        inner
            .send_control(&Control::Accept {
                id: pid,
                ring: ring.descriptor(),
                polled,
            })
            .await?;

        // The peer's answer to ours.
        let answer = inner
            .handshake("channel Accept", |_, c| match c {
                Control::Accept {
                    id: a,
                    ring,
                    polled,
                } if *a == id => Some(Ok((*ring, *polled))),
                Control::Refuse { id: a, reason } if *a == id => Some(Err(reason.clone())),
                _ => None,
            })
            .await
            .map_err(|e| half_done(inner, e))?;
        match answer {
            Ok((r, polled)) => {
                tx.ring.set(Some(r));
                tx.polled.set(polled);
            }
            Err(reason) => {
                // Neither half will carry anything: the peer dropped its own (its open failed
                // on our refusal's reason), so ours take nothing more either.
                let mut s = inner.shared.borrow_mut();
                s.chans.remove(&id);
                s.chans.remove(&pid);
                drop(s);
                inner.give_back_recvs(tx_recvs + rx_recvs);
                // The refusal was the peer's last word for `id`.
                inner.free_chan_id(id);
                return Err(Error::type_mismatch(
                    format!("{fp} with codec {}", C::ID),
                    format!("a channel the peer refused: {reason}"),
                ));
            }
        }
        let credit_src = Buffer::new(&inner.pd, 64, 64, Access::LOCAL_WRITE)?;
        Ok((
            Sender {
                link: self.link.clone(),
                st: tx,
                scratch: RefCell::new(Vec::with_capacity(opts.max_message)),
                _t: PhantomData,
            },
            Receiver {
                link: self.link.clone(),
                st: rx,
                sender_credit: pcredit,
                credit_src,
                consumed: Cell::new(0),
                tail: Cell::new(0),
                credited: Cell::new(0),
                step: credit_step(pcap as u64, pslot as usize),
                returns: Cell::new(0),
                waited: Cell::new(false),
                _t: PhantomData,
            },
        ))
    }
}

/// Refuses the peer's half `pid` of a channel this side cannot open, so that the peer's open
/// fails with `e`'s reason instead of waiting; forgets this side's half `id`, with the peer's
/// answer to it if that came meanwhile (one that comes later is dropped on arrival), and gives
/// back the `recvs` receives it added (the peer, whose open fails too, sends it nothing). The
/// id is free again once that answer has come (see `Shared::unanswered`).
async fn refuse(
    inner: &crate::endpoint::Inner,
    pid: u16,
    id: u16,
    recvs: usize,
    e: Error,
) -> Error {
    let _ = inner
        .send_control(&Control::Refuse {
            id: pid,
            reason: e.to_string(),
        })
        .await;
    let mut s = inner.shared.borrow_mut();
    s.chans.remove(&id);
    let queued = s.inbox.len();
    s.inbox.retain(|(_, c)| {
        !matches!(c, Control::Accept { id: a, .. } | Control::Refuse { id: a, .. } if *a == id)
    });
    let answered = s.inbox.len() < queued;
    if !answered {
        s.unanswered.push(id);
    }
    drop(s);
    if answered {
        inner.free_chan_id(id);
    }
    inner.give_back_recvs(recvs);
    e
}

/// A channel handshake the peer left half done: the two sides would pair later channels
/// wrongly, so the connection is failed and closed.
fn half_done(inner: &crate::endpoint::Inner, e: Error) -> Error {
    match e {
        Error::Timeout(_) => inner.abandon(e),
        e => e,
    }
}
