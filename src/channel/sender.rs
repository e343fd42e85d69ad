//! The sending half's API: `send` and its future, `flush`, and what a dropped sender tells
//! the receiver.

use super::*;

impl<T, C: Codec<T>> Sender<T, C> {
    fn inner(&self) -> &Inner {
        &self.link.inner
    }

    /// The receiver's credit word: its consumed count, with `GONE` once it is gone.
    fn credits(&self) -> u64 {
        self.st.credit.load_u64(0)
    }

    /// True if the receiver has said it consumed everything sent so far.
    fn all_consumed(&self) -> bool {
        self.credits() & !GONE >= self.st.seq.get()
    }

    /// Sends one message: in order, exactly once, unless the connection fails. Returns once
    /// the message is in its slot of the outgoing run (it goes out when this task yields, or
    /// sooner; see the module docs); waits while the ring is full, for as long as the receiver
    /// runs (a receiver that is stopped, hung or cut off makes it fail with
    /// [`Error::PeerGone`] within about two seconds; see the module docs).
    ///
    /// A message that finds room is placed by the first poll of the returned future, inlined
    /// where it is awaited, with no state machine of its own.
    ///
    /// ```no_run
    /// # async fn demo(tx: barewire::Sender<[u8; 64]>) -> barewire::Result<()> {
    /// for i in 0..1000u32 {
    ///     let mut msg = [0u8; 64];
    ///     msg[..4].copy_from_slice(&i.to_le_bytes());
    ///     tx.send(&msg).await?; // waits only while the receiver's ring is full
    /// }
    /// tx.flush().await?; // every message is in the receiver's ring
    /// # Ok(())
    /// # }
    /// ```
    pub fn send<'a>(&'a self, item: &'a T) -> Sending<'a, T, C> {
        Sending {
            tx: self,
            item,
            encoded: None,
            waiting: false,
        }
    }

    /// Sends `bytes` as one message, as `send` does with an item's encoding (tests send
    /// what no codec would).
    #[cfg(test)]
    pub(super) async fn send_bytes(&self, bytes: &[u8]) -> Result<()> {
        let mut waiting = false;
        poll_fn(|cx| self.poll_place(bytes, &mut waiting, cx)).await
    }

    /// Places `bytes` as the next message, or waits for room (`waiting`: this send has found
    /// the ring full before, and posted what was pending then).
    #[inline(always)]
    fn poll_place(
        &self,
        bytes: &[u8],
        waiting: &mut bool,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        loop {
            match self.try_place(bytes) {
                Ok(true) => return Poll::Ready(Ok(())),
                Ok(false) => {}
                Err(e) => return Poll::Ready(Err(*e)),
            }
            match self.poll_room(waiting, cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
    }

    /// Ready once the next message has a free slot in the ring (`Ok`), or the channel has
    /// failed or the receiver gone (`Err`); otherwise registers to be woken by the receiver's
    /// next credits. The first time a send finds the ring full it posts what is pending: the
    /// receiver cannot free slots it has not seen.
    #[inline(never)]
    fn poll_room(&self, waiting: &mut bool, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let st = &self.st;
        if !std::mem::replace(waiting, true) && st.full() {
            st.post_run()?;
        }
        if let Some(e) = &self.inner().shared.borrow().error {
            return Poll::Ready(Err(e.clone()));
        }
        let c = self.credits();
        if c & GONE != 0 {
            return Poll::Ready(Err(Error::Closed));
        }
        if st.seq.get() - c < st.capacity {
            *waiting = false;
            return Poll::Ready(Ok(()));
        }
        st.waker.register(cx.waker());
        if !st.watching.replace(true) {
            barewire_engine::spawn_local(send::watch_receiver(Rc::downgrade(&self.st)));
        }
        Poll::Pending
    }

    /// Places `bytes` as the next message if the ring has room for it (`false`: it has not,
    /// or the channel has failed; `send_bytes` then waits and reports). The error is boxed:
    /// this runs once per message, and a `Result<(), Error>` is four words that every caller
    /// would copy on the way back, `Ok` or not. Inlined into `send`, where a plain-data
    /// message's length is a constant and its copies need no call.
    #[inline(always)]
    fn try_place(&self, bytes: &[u8]) -> std::result::Result<bool, Box<Error>> {
        let st = &self.st;
        let max = (st.slot - extent(0)).min(imm::MAX_MESSAGE);
        if bytes.len() > max {
            return Err(Box::new(Error::TooLarge {
                len: bytes.len(),
                max,
            }));
        }
        if C::FIXED_LEN.is_some_and(|n| n != bytes.len()) {
            // The receiver relies on the length (see `Codec::FIXED_LEN`).
            return Err(Box::new(Error::Invalid(format!(
                "the codec gave {} bytes where all its messages are {:?} bytes",
                bytes.len(),
                C::FIXED_LEN
            ))));
        }
        let seq = st.seq.get();
        // Room in the ring: fewer than `capacity` messages unconsumed. The credit word is read
        // again only once the room it showed is used up, and at least every credit step (a
        // quarter of the ring), which is also how soon a receiver that has gone is noticed.
        if seq >= st.room_until.get() {
            let c = self.credits();
            if c & GONE != 0 || seq - c.min(seq) >= st.capacity {
                return Ok(false);
            }
            st.room_until.set((c + st.capacity).min(seq + st.step));
        }
        if self.failed() {
            return Ok(false);
        }
        let head = st.head.get();
        let at = head * st.slot;
        let wrapped = head + 1 == st.capacity as usize;
        let next = if wrapped { 0 } else { head + 1 };
        if let Some(m) = st.direct.get() {
            // Straight into the receiver's slot, which is free (the credit check above): the
            // message, its mark, then its length word. The first message since this task last
            // yielded (no run pending, none went straight in since the flush poller ran) is
            // published at once: its length word has `LEN_SET`, and the receiver, which reads
            // that word first, finds the rest in. The rest of a burst is stored unpublished
            // (`LEN_SET` clear, which the receiver reads as not yet written) and published as a
            // run (`TxState::publish`): each message is written once, where a staged run was
            // written twice, and the receiver does not chase the sender through the lines it is
            // writing.
            let len = bytes.len();
            // One checked span for the slot's three stores.
            let slot = m.span(at, st.slot);
            slot.write(PREFIX, bytes);
            slot.store_u32_le(extent(len) - MARK_LEN, MARK);
            st.seq.set(seq + 1);
            st.head.set(next);
            if st.posted.get() == seq && !st.wake_due.get() {
                slot.store_u32_le(0, len as u32 | LEN_SET);
                st.posted.set(seq + 1);
                st.run_at.set(next);
                // The receiver sees it at once unless it sleeps; the flush poller looks at
                // that once this task yields.
                st.wake_due.set(true);
                schedule(st);
                return Ok(true);
            }
            slot.store_u32_le(0, len as u32);
            // In a burst: the slot a few ahead, for writing, once the receiver has consumed it
            // (see `PREFETCH_SLOTS`), not one it may still be reading.
            if seq + (PREFETCH_SLOTS as u64) < st.room_until.get() {
                m.prefetch_for_write(ahead(at, st.slot, st.capacity), PREFETCH_BYTES);
            }
            if wrapped || seq + 1 - st.posted.get() >= st.run_limit {
                st.post_run().map_err(Box::new)?;
            } else {
                schedule(st);
            }
            return Ok(true);
        }
        // The staging slot is free: it last held message `seq - capacity`, which the receiver
        // has consumed (the credit check above), so it was placed, so it was sent.
        // One checked span for the slot's three stores (see `Buffer::span`).
        let slot = st.staging.span(at, st.slot);
        slot.store_u32_le(0, bytes.len() as u32 | LEN_SET);
        slot.write(PREFIX, bytes);
        slot.store_u32_le(extent(bytes.len()) - MARK_LEN, MARK);
        st.last_len.set(bytes.len());
        st.seq.set(seq + 1);
        st.head.set(next);
        // A run ends at the ring's end (a WRITE covers contiguous slots), at RUN_BYTES, or at
        // once when slots are large (a run would carry each slot's unused tail).
        if wrapped || seq + 1 - st.posted.get() >= st.run_limit {
            // Batched: a sender in a burst posts many of these before it yields, and they
            // leave together in one system call; a ring in halves sends each half at once.
            st.post_run_with(!st.halves()).map_err(Box::new)?;
        } else {
            schedule(st);
        }
        Ok(true)
    }

    /// The connection has failed.
    fn failed(&self) -> bool {
        self.inner().failed.get()
    }

    /// Waits until every message sent so far has been placed in the receiver's ring. If the
    /// connection closes first, succeeds only when the receiver had taken every message (a
    /// dropped receiver tells the sender how many it took, ahead of the hang-up), and fails
    /// with [`Error::PeerGone`] otherwise.
    pub async fn flush(&self) -> Result<()> {
        let Some(ring) = self.st.ring.get() else {
            return Ok(());
        };
        self.st.post_run()?;
        // A zero-length READ completes only after everything posted before it has been
        // carried out at the peer.
        let probe = self
            .inner()
            .ops
            .read(&self.st.staging, 0, 0, Remote::at(ring, 0));
        let mut done = Ok(());
        loop {
            // (The borrow ends here: the flush poller may post while this waits.)
            let Some(op) = self.st.inflight.borrow_mut().pop_front() else {
                break;
            };
            if let Err(e) = op.await {
                done = Err(e);
            }
        }
        match done.and(probe.await.map(|_| ())) {
            Ok(()) => Ok(()),
            // The connection went, but the receiver had taken every message first (its last
            // word travels before the hang-up): nothing was lost.
            Err(_) if self.all_consumed() => Ok(()),
            Err(e) => Err(self.inner().driver_error(e)),
        }
    }

    /// Messages sent so far.
    pub fn sent(&self) -> u64 {
        self.st.seq.get()
    }
}

impl<T, C: Codec<T>> Drop for Sender<T, C> {
    fn drop(&mut self) {
        // Post what is pending, then tell the receiver no more is coming (it drains what
        // already arrived first). The close notice holds the staging buffer until it
        // completes, so the pending run's bytes stay valid too.
        let _ = self.st.post_run();
        if let Some(ring) = self.st.ring.get() {
            if self.inner().shared.borrow().error.is_none() {
                drop(self.inner().ops.write_with_imm(
                    &self.st.staging,
                    0,
                    0,
                    Remote::at(ring, 0),
                    imm::data(self.st.id, None),
                ));
            }
        }
        self.inner().shared.borrow_mut().chans.remove(&self.st.id);
        // The receiver may still write its credit word, until its final one; after that the
        // id is free for another channel.
        self.inner().half_dropped(
            Retired {
                id: self.st.id,
                buf: self.st.credit.clone(),
                recvs: self.st.recvs(),
            },
            credit_word_final(&self.st.credit),
        );
    }
}

/// The future of [`Sender::send`]. A named type whose `poll` inlines into the awaiting code:
/// a message that finds room in the ring is placed by the first poll, with no state machine
/// of its own around it.
///
/// Dropping it while the ring is full places nothing: the message is not sent, and the
/// sender can carry on (or give up) with nothing half-written.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
/// # let (_nodes, a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
/// use barewire::{engine::{spawn_local, time}, ChannelOptions};
/// use std::time::Duration;
/// let opts = ChannelOptions::new(2, 8); // room for two messages in flight
/// let far = spawn_local(async move { a.open_channel::<u64>(opts).await.unwrap() });
/// let (tx, _rx) = b.open_channel::<u64>(opts).await.unwrap();
/// let (_tx, rx) = far.await.unwrap();
/// tx.send(&1).await.unwrap();
/// tx.send(&2).await.unwrap();
/// // Full, and nobody reads: the third send gives up at its deadline...
/// assert!(time::timeout(Duration::from_millis(10), tx.send(&3)).await.is_err());
/// assert_eq!(tx.sent(), 2); // ...and was never sent.
/// assert_eq!(rx.recv().await.unwrap(), 1);
/// assert_eq!(rx.recv().await.unwrap(), 2);
/// # });
/// ```
#[must_use = "futures do nothing unless awaited"]
pub struct Sending<'a, T, C: Codec<T>> {
    tx: &'a Sender<T, C>,
    item: &'a T,
    /// The item's encoding, for a codec that encodes (the sender's scratch buffer, taken by
    /// the first poll and given back once the message is placed).
    encoded: Option<Vec<u8>>,
    /// The ring was full, and the run pending then was posted.
    waiting: bool,
}

impl<T, C: Codec<T>> Future for Sending<'_, T, C> {
    type Output = Result<()>;

    #[inline(always)]
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if let Some(bytes) = C::as_bytes(this.item) {
            return this.tx.poll_place(bytes, &mut this.waiting, cx);
        }
        this.poll_encoded(cx)
    }
}

impl<T, C: Codec<T>> Sending<'_, T, C> {
    /// `poll` for a codec that encodes: once into the scratch buffer, then placed from there.
    fn poll_encoded(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let tx = self.tx;
        let bytes = match &mut self.encoded {
            Some(bytes) => bytes,
            None => {
                let mut bytes = std::mem::take(&mut *tx.scratch.borrow_mut());
                bytes.clear();
                if let Err(e) = C::encode(self.item, &mut bytes) {
                    *tx.scratch.borrow_mut() = bytes;
                    return Poll::Ready(Err(e));
                }
                self.encoded.insert(bytes)
            }
        };
        let r = tx.poll_place(bytes, &mut self.waiting, cx);
        if r.is_ready() {
            if let Some(bytes) = self.encoded.take() {
                *tx.scratch.borrow_mut() = bytes;
            }
        }
        r
    }
}
