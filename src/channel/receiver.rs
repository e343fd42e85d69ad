//! The receiving half's API: `recv`, `recv_into` and `recv_many` with their futures, the
//! credits a receiver returns, and what a dropped receiver tells the sender.

use super::*;

impl<T, C: Codec<T>> Receiver<T, C> {
    fn inner(&self) -> &Inner {
        &self.link.inner
    }

    /// The next message, in the order sent. Waits for one; [`Error::Closed`] once the sender
    /// is gone and everything it sent has been received; [`Error::PeerGone`] if the connection
    /// failed.
    ///
    /// A message already here is taken and returned by the first poll, with no state machine
    /// of its own around it (see [`Recv`]). A receiver that keeps up with a stream of small
    /// messages can take each into one buffer of its own with [`recv_into`](Self::recv_into),
    /// or take them in batches with [`recv_many`](Self::recv_many).
    pub fn recv(&self) -> Recv<'_, T, C> {
        Recv { rx: self }
    }

    /// The next message, into `out`, which keeps it until the next call: what `read_exact`
    /// into a buffer is to a byte stream. Waits and fails as [`recv`](Self::recv) does; on an
    /// error `out` is left as it was.
    ///
    /// Nothing is moved on the way: plain-old-data is copied out of the ring straight into
    /// `out` (where `recv` hands the value back through its `Result`, a copy per move), and a
    /// [`Bytes`] channel reuses `out`'s allocation message after message.
    ///
    /// ```
    /// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
    /// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
    /// # let (_nodes, a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
    /// use barewire::{engine::spawn_local, ChannelOptions};
    /// let opts = ChannelOptions::new(64, 64);
    /// let far = spawn_local(async move { a.open_channel::<[u8; 64]>(opts).await.unwrap() });
    /// let (_tx, rx) = b.open_channel::<[u8; 64]>(opts).await.unwrap();
    /// let (tx, _rx) = far.await.unwrap();
    /// for i in 0..3u8 {
    ///     tx.send(&[i; 64]).await.unwrap();
    /// }
    /// let mut msg = [0u8; 64]; // one buffer for every message
    /// let mut sum = 0u32;
    /// for _ in 0..3 {
    ///     rx.recv_into(&mut msg).await.unwrap();
    ///     sum += msg[0] as u32;
    /// }
    /// assert_eq!(sum, 0 + 1 + 2);
    /// # });
    /// ```
    pub fn recv_into<'a>(&'a self, out: &'a mut T) -> RecvInto<'a, T, C> {
        RecvInto { rx: self, out }
    }

    /// Waits for the next message, then appends it and every further message already here,
    /// up to `limit` in all, to `out`, in the order sent; returns how many it appended (0 only
    /// when `limit` is 0). Errors as [`recv`](Self::recv) does; an error met after some messages
    /// were appended leaves them in `out`.
    ///
    /// For a receiver that keeps up with a stream of messages: one wait covers a batch, and
    /// plain-old-data is copied out of the ring straight into `out`, where `recv` hands each
    /// message back through its own `Result`.
    ///
    /// ```no_run
    /// # async fn demo(rx: barewire::Receiver<[u8; 64]>) -> barewire::Result<()> {
    /// let mut batch = Vec::with_capacity(256);
    /// loop {
    ///     batch.clear();
    ///     match rx.recv_many(&mut batch, 256).await {
    ///         Ok(_) => {}
    ///         Err(barewire::Error::Closed) => return Ok(()),
    ///         Err(e) => return Err(e),
    ///     }
    ///     for msg in &batch {
    ///         // ... use msg
    ///         # let _ = msg;
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn recv_many(&self, out: &mut Vec<T>, limit: usize) -> Result<usize> {
        if limit == 0 {
            return Ok(0);
        }
        let mut taken = 0;
        while taken < limit {
            // A decode error is kept aside, and `take_next` builds its own result (see there).
            let mut failed = None;
            let took = self.take_next(|len, slot| {
                // Only an error is stored: an `Ok` moved into `failed` is a copy of stale
                // stack words per message, from stores of other widths.
                if let Err(e) = C::decode_push(len, |b| slot.read(PREFIX, b), out) {
                    failed = Some(e);
                }
            });
            match took {
                Some(r) => r?,
                // Nothing here: wait for the first message, return with any later one.
                None if taken == 0 => {
                    self.wait().await?;
                    continue;
                }
                None => break,
            }
            if let Some(e) = failed {
                return Err(e);
            }
            taken += 1;
        }
        Ok(taken)
    }

    /// Whether the next message is here.
    #[inline(always)]
    fn ready(&self) -> bool {
        if self.st.polled {
            self.st.landed(self.tail.get() * self.st.slot)
        } else {
            self.st.arrived.get() > self.consumed.get()
        }
    }

    /// Waits until the next message is here, or the channel is closed or failed.
    async fn wait(&self) -> Result<()> {
        poll_fn(|cx| self.poll_ready(cx)).await
    }

    /// Ready once the next message is here (`Ok`), or the channel is closed or failed (`Err`);
    /// otherwise registers to be woken when that changes.
    #[inline(always)]
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.ready() {
            return Poll::Ready(Ok(()));
        }
        self.poll_arrival(cx)
    }

    /// `poll_ready` once the next message was not there: out of line, so that a receiver
    /// keeping up with a stream takes each message with no call.
    #[inline(never)]
    fn poll_arrival(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.ready() {
            return Poll::Ready(Ok(()));
        }
        if self.st.closed.get() {
            return Poll::Ready(Err(Error::Closed));
        }
        if let Some(e) = &self.inner().shared.borrow().error {
            return Poll::Ready(Err(e.clone()));
        }
        self.st.waker.register(cx.waker());
        if self.st.polled {
            watch(&self.st, self.tail.get() * self.st.slot);
        }
        self.waited.set(true);
        Poll::Pending
    }

    /// Takes the next message if it is here: `None` when it is not (a polled ring's slot has
    /// not fully landed, see [`RxState::look`]; an announced ring has no arrival counted for
    /// it). Otherwise `decode` gets its length and its slot (the message starts `PREFIX` bytes
    /// in), and is called exactly once when this returns `Some(Ok)` (never when the length word
    /// is bad); then the slot is freed (also when `decode` fails: the message was the peer's,
    /// and is gone).
    ///
    /// A polled ring's slot is looked at once (`RxState::look`): one checked span and one load
    /// of the length word, then the mark, the message and the clearing stores all through that
    /// span. Before, `recv` asked whether the message had landed and then took it, each finding
    /// the slot and loading its length on its own: 164 instructions per `recv` of a 64-byte
    /// message over shm against 119 now (callgrind), and 1.07x the messages per second
    /// (bench/RESULTS.md, forty-fourth session).
    ///
    /// `decode` keeps its own result, so what this returns is built here, never moved from the
    /// closure. (A `Result` the closure returned, moved out after the bookkeeping below, is
    /// copied whole, payload bytes included, from stores of other widths: a failed store
    /// forwarding per message, about a tenth of the receiver's time in channel-bench's
    /// `recv_many`, and a sixth in `recv`'s.)
    #[inline(always)]
    fn take_next(&self, decode: impl FnOnce(usize, Span<'_>)) -> Option<Result<()>> {
        let n = self.consumed.get();
        let tail = self.tail.get();
        let at = tail * self.st.slot;
        if self.st.polled {
            let (len, slot) = match self.st.look(at) {
                Look::Landed(len, slot) => (len, slot),
                Look::Landing => return None,
                Look::Oversized => return Some(Err(self.malformed_length(at))),
            };
            // In a stream (this message was here without a wait), over shm: the slot a few
            // ahead, for reading (see `PREFETCH_SLOTS`).
            if !self.waited.replace(false) && self.st.peer_stores {
                self.st
                    .ring
                    .prefetch(ahead(at, self.st.slot, self.st.capacity), PREFETCH_BYTES);
            }
            decode(len, slot);
            self.st
                .clear_taken(&slot, at, len, C::FIXED_LEN == Some(len));
        } else {
            if self.st.arrived.get() <= n {
                return None;
            }
            let slot = self.st.slot_at(at);
            // Announced, so written: a zero word or a length the slot cannot hold is the
            // peer's fault.
            let max = self.st.slot - extent(0);
            let Some(len) = length(slot.load_u32_le(0)).filter(|&len| len <= max) else {
                return Some(Err(self.malformed_length(at)));
            };
            decode(len, slot);
        }
        self.consumed.set(n + 1);
        self.tail.set(if tail + 1 == self.st.capacity as usize {
            0
        } else {
            tail + 1
        });
        if n + 1 - self.credited.get() >= self.step {
            self.return_credits(n + 1);
        }
        Some(Ok(()))
    }

    /// `take_next` for a future's poll: ready once the next message was taken (`decode` called
    /// once with it, as by `take_next`), or the channel is closed or failed; otherwise
    /// registered to be woken when that changes.
    #[inline(always)]
    fn poll_take(
        &self,
        cx: &mut Context<'_>,
        mut decode: impl FnMut(usize, Span<'_>),
    ) -> Poll<Result<()>> {
        loop {
            match self.take_next(&mut decode) {
                Some(r) => return Poll::Ready(r),
                // Not here: closed, failed, or registered to be woken; here after all (it
                // landed meanwhile): taken on the next turn.
                None => match self.poll_arrival(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                },
            }
        }
    }

    /// The error for a slot at `at` whose length word is zero or more than the slot holds.
    #[cold]
    #[inline(never)]
    fn malformed_length(&self, at: usize) -> Error {
        Error::Malformed(format!(
            "length word {:#x} in a {}-byte slot",
            self.st.ring.load_u32_le(at),
            self.st.slot
        ))
    }

    fn return_credits(&self, count: u64) {
        self.credited.set(count);
        self.credit_src.write_at(0, &count.to_ne_bytes());
        let op = SendOp::WriteWithImm {
            remote_addr: self.sender_credit.addr,
            rkey: self.sender_credit.rkey,
            imm: imm::credit(self.st.id),
        };
        let sge = self.credit_src.sge(0, 8);
        let ops = &self.inner().ops;
        // Not awaited: credits only grow, and a failure shows up on the next recv. One in 16
        // (and the last) is signaled, so the send queue drains on verbs too.
        let returns = self.returns.get() + 1;
        self.returns.set(returns);
        if returns % 16 == 0 || count & GONE != 0 {
            drop(ops.execute(op, sge, [self.credit_src.clone()], false));
        } else if let Err(e) = ops.post_unsignaled_with(
            op,
            sge,
            &self.credit_src,
            // A ring in halves has its credits sent at once.
            !halves(self.st.capacity, self.st.slot),
        ) {
            self.inner().driver_error(e);
        }
    }

    /// Messages received so far.
    pub fn received(&self) -> u64 {
        self.consumed.get()
    }
}

/// The future of [`Receiver::recv`]. A message already here is taken by the first poll.
///
/// Dropping it before it completes takes nothing: a wait for a message can be given a
/// deadline, and the next `recv` gets the message the abandoned one would have.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
/// # let (_nodes, a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
/// use barewire::{engine::{spawn_local, time}, ChannelOptions};
/// use std::time::Duration;
/// let opts = ChannelOptions::new(8, 8);
/// let far = spawn_local(async move { a.open_channel::<u64>(opts).await.unwrap() });
/// let (_tx, rx) = b.open_channel::<u64>(opts).await.unwrap();
/// let (tx, _rx) = far.await.unwrap();
/// // Nothing was sent: the wait ends at its deadline.
/// assert!(time::timeout(Duration::from_millis(10), rx.recv()).await.is_err());
/// tx.send(&5).await.unwrap();
/// assert_eq!(time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap(), 5);
/// # });
/// ```
#[must_use = "futures do nothing unless awaited"]
pub struct Recv<'a, T, C: Codec<T>> {
    rx: &'a Receiver<T, C>,
}

impl<T, C: Codec<T>> Future for Recv<'_, T, C> {
    type Output = Result<T>;

    // Out of line: the message then reaches the caller's `Poll<Result<T>>` through its return
    // pointer, and the caller reads it from there. Inlined, the compiler moved that value
    // (a 64-byte message sits at offset 1 of a 72-byte `Result`) from stack slot to stack slot
    // in pieces that straddled the stores before them, and each such load waited for its
    // stores to drain instead of being forwarded from them: `Channel<[u8; 64]>` over shm took
    // 35 M msg/s inlined and 58 out of line, with each message handed to `black_box`; 49 and
    // 59 with a receiver that adds up every word (bench/RESULTS.md, forty-second session).
    #[inline(never)]
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let rx = self.rx;
        // Decoded in place and returned from there (see `Codec::decode_into`).
        let mut value = std::mem::MaybeUninit::uninit();
        let mut failed = None;
        let took = rx.poll_take(cx, |len, slot| {
            if let Err(e) = C::decode_into(len, |out| slot.read(PREFIX, out), &mut value) {
                failed = Some(e);
            }
        });
        match took {
            Poll::Ready(Ok(())) => Poll::Ready(match failed {
                Some(e) => Err(e),
                // SAFETY: `poll_take` called the closure once with the message it took, since
                // it returned `Ready(Ok)`, and `decode_into` initialized `value` (it returned
                // `Ok`: `failed` is `None`).
                None => Ok(unsafe { value.assume_init() }),
            }),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The future of [`Receiver::recv_into`]. A message already here is taken by the first poll.
///
/// Dropping it before it completes takes nothing, and leaves `out` as it was.
#[must_use = "futures do nothing unless awaited"]
pub struct RecvInto<'a, T, C: Codec<T>> {
    rx: &'a Receiver<T, C>,
    out: &'a mut T,
}

impl<T, C: Codec<T>> Future for RecvInto<'_, T, C> {
    type Output = Result<()>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let out = &mut *this.out;
        let mut failed = None;
        let took = this.rx.poll_take(cx, |len, slot| {
            if let Err(e) = C::decode_replace(len, |b| slot.read(PREFIX, b), out) {
                failed = Some(e);
            }
        });
        // (Matched on `took` alone: a match on the pair `(took, failed)` made `recv_into` over
        // shm 0.65-0.75x as fast in channel-bench, alternated.)
        match took {
            Poll::Ready(Ok(())) => Poll::Ready(match failed {
                Some(e) => Err(e),
                None => Ok(()),
            }),
            took => took,
        }
    }
}

impl<T, C: Codec<T>> Drop for Receiver<T, C> {
    fn drop(&mut self) {
        // Tell the sender how many it took, and that it is gone: its next send fails, and its
        // flush knows whether everything arrived.
        if self.inner().shared.borrow().error.is_none() {
            self.return_credits(self.consumed.get() | GONE);
        }
        self.inner().shared.borrow_mut().chans.remove(&self.st.id);
        // The sender may still write into the ring, until its close notice.
        self.inner().half_dropped(
            Retired {
                id: self.st.id,
                buf: self.st.ring.clone(),
                recvs: self.st.recvs(),
            },
            self.st.closed.get(),
        );
    }
}
