//! `SharedArray<T>`: the client side of the protocol in the module doc, over a mesh.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire_drivers::Transport;
use barewire_engine::sync::{Permit, Semaphore};
use barewire_engine::{spawn_local, time, yield_now, JoinHandle};
use bytemuck::Pod;

use super::home::{serve, Home, Msg, Outcome, Pending, Words};
use super::layout::{Layout, LockWord, APPLYING, FREE};
use super::{Broken, SharedOptions};
use crate::channel::{Bare, ChannelOptions, Sender};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::join::try_join_all;
use crate::mesh::Mesh;
use crate::node::Node;
use crate::region::{Align, Fingerprint, Region, RemoteRegion};

/// How long a commit waits for its answer before it checks that the home is still there.
const ANSWER_PROBE: Duration = Duration::from_millis(10);

/// How long a commit waits for its answer at most. The probe catches a home that is gone
/// where the transport needs the home's own progress to answer a READ (the software
/// provider); where the home's memory is served without its CPU (shm, a NIC), a stopped home
/// answers the probe and only this deadline ends the wait. The fault bound's order.
const ANSWER_DEADLINE: Duration = Duration::from_secs(1);

/// Client ids per process per array: lock owners are `1 + rank * CLIENTS + k`.
const CLIENTS: u16 = 64;

/// A global array of `len` `T`s, block-distributed over the members of a [`Mesh`]: element `i`
/// lives on rank `i / block`, where `block = ceil(len / size)`. Any member reads, writes and
/// updates any element with one-sided operations; every single-element operation is
/// linearizable (see [the module doc](crate::dsm) for the protocol and why).
///
/// Every member creates the same arrays in the same order (a collective call, as in MPI).
///
/// ```no_run
/// # async fn demo(node: &barewire::Node, mesh: &barewire::Mesh) -> barewire::Result<()> {
/// use barewire::dsm::{SharedArray, SharedOptions};
/// let hits = SharedArray::<u64>::create(node, mesh, 1_000, 0, SharedOptions::default()).await?;
/// hits.fetch_add(17, 1).await?;                  // an RDMA atomic on element 17's home
/// let n = hits.update(3, |v| v * 2 + 1).await?;  // read-modify-write, no lost update
/// assert_eq!(hits.get(3).await?, n);
/// # Ok(()) }
/// ```
pub struct SharedArray<T: Pod> {
    inner: Rc<Inner>,
    _t: std::marker::PhantomData<T>,
}

struct Inner {
    rank: usize,
    len: u64,
    block: u64,
    layout: Layout,
    opts: SharedOptions,
    /// Per rank: what reaches it.
    homes: Vec<Remote>,
    /// Free lock-owner ids of this node, and a permit per id.
    ids: RefCell<Vec<u16>>,
    id_wait: Semaphore,
    servers: Vec<JoinHandle<()>>,
    /// Leases this node broke.
    breaks: Cell<u64>,
    /// Commits of this node that came back fenced (its lease had been broken).
    fenced: Cell<u64>,
}

/// What this node needs to reach one rank's block.
struct Remote {
    ep: Endpoint,
    block: RemoteRegion<u64>,
    /// Commits in flight to it, and the channel they go on.
    pending: Rc<Pending>,
    commits: Rc<Sender<Msg, Bare>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for s in &self.servers {
            s.cancel();
        }
    }
}

/// A lock-owner id, held for one operation.
struct Client<'a> {
    inner: &'a Inner,
    id: u16,
    _permit: Permit<'a>,
}

impl Drop for Client<'_> {
    fn drop(&mut self) {
        self.inner.ids.borrow_mut().push(self.id);
    }
}

impl<T: Pod> SharedArray<T> {
    /// Creates the array on every member of `mesh` (collective: every member calls it with the
    /// same `len`), every element set to `initial`.
    pub async fn create(
        node: &Node,
        mesh: &Mesh,
        len: u64,
        initial: T,
        opts: SharedOptions,
    ) -> Result<SharedArray<T>> {
        let size = mesh.size();
        let rank = mesh.rank();
        if len == 0 {
            return Err(Error::Invalid("a shared array of no elements".into()));
        }
        if (rank + 1) * CLIENTS as usize >= APPLYING as usize {
            return Err(Error::Invalid(format!(
                "shared arrays support meshes of up to {} members",
                APPLYING / CLIENTS - 1
            )));
        }
        let layout = Layout::of::<T>();
        let block = len.div_ceil(size as u64);
        let mine = block.min(len.saturating_sub(rank as u64 * block));
        let region = node.region::<u64>(block as usize * layout.stride, Align::CacheLine)?;
        for s in 0..mine as usize {
            if layout.wide {
                let slot = layout.encode(LockWord::new(1, 0, FREE), 1, &initial);
                region.copy_from(s * layout.stride, &slot);
            } else {
                region.set(s, as_word(&initial));
            }
        }
        // Each member's block, described as holding `block` elements of `T` (so a member that
        // made the array with another element type or length is refused here).
        let fp = Fingerprint::of::<T>();
        for j in 0..size {
            let ep = mesh.endpoint(j);
            ep.send_described(ep.window_for(&region.buf)?, fp.clone(), block)
                .await?;
        }
        let mut blocks = Vec::with_capacity(size);
        for j in 0..size {
            let (d, n) = mesh
                .inbound_from(j)
                .recv_described(&fp, layout.stride as u64 * 8)
                .await?;
            if n != block {
                return Err(Error::Invalid(format!(
                    "rank {j} made this shared array with blocks of {n} elements, this node with \
                     {block}: every member must create it with the same length"
                )));
            }
            blocks.push(RemoteRegion::<u64>::from_parts(
                d,
                block * layout.stride as u64,
            ));
        }
        let words = if matches!(node.device().transport(), Transport::Soft | Transport::Shm) {
            Words::Cpu
        } else {
            Words::Rdma(mesh.endpoint(rank).clone(), blocks[rank])
        };
        let home = Rc::new(Home {
            block: region,
            layout,
            slots: mine,
            words,
            broken: opts.broken,
        });

        // One duplex channel on each connection end: commits go out on it and their answers
        // come back; the two ends of the connection to itself pair with each other.
        let copts = ChannelOptions::new(64, layout.size + 64);
        let mut ends: Vec<&Endpoint> = (0..size).map(|j| mesh.endpoint(j)).collect();
        ends.push(mesh.inbound_from(rank));
        let chans = try_join_all(
            ends.iter()
                .map(|ep| ep.open_bare_channel::<Msg>(copts))
                .collect(),
        )
        .await?;
        let mut homes = Vec::with_capacity(size);
        let mut servers = Vec::with_capacity(size + 1);
        for (j, (tx, rx)) in chans.into_iter().enumerate() {
            let tx = Rc::new(tx);
            if j < size {
                let pending = Rc::new(Pending::default());
                servers.push(spawn_local(serve(
                    home.clone(),
                    tx.clone(),
                    rx,
                    Some(pending.clone()),
                )));
                homes.push(Remote {
                    ep: mesh.endpoint(j).clone(),
                    block: blocks[j],
                    pending,
                    commits: tx,
                });
            } else {
                servers.push(spawn_local(serve(home.clone(), tx, rx, None)));
            }
        }
        let first = 1 + rank as u16 * CLIENTS;
        Ok(SharedArray {
            inner: Rc::new(Inner {
                rank,
                len,
                block,
                layout,
                opts,
                homes,
                ids: RefCell::new((first..first + CLIENTS).rev().collect()),
                id_wait: Semaphore::new(CLIENTS as usize),
                servers,
                breaks: Cell::new(0),
                fenced: Cell::new(0),
            }),
            _t: std::marker::PhantomData,
        })
    }

    /// Elements.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// True when it has no elements (never: `create` refuses that).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The rank whose memory holds element `i`.
    pub fn home_of(&self, i: u64) -> usize {
        (i / self.inner.block) as usize
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Leases this node has broken so far (locks whose holder stopped renewing them).
    pub fn lease_breaks(&self) -> u64 {
        self.inner.breaks.get()
    }

    /// This node's commits that its lease's breaking fenced off so far (each was redone).
    pub fn fenced_commits(&self) -> u64 {
        self.inner.fenced.get()
    }

    fn locate(&self, i: u64) -> Result<(&Remote, u64)> {
        if i >= self.inner.len {
            return Err(Error::OutOfBounds {
                index: i,
                count: 1,
                len: self.inner.len,
            });
        }
        Ok((&self.inner.homes[self.home_of(i)], i % self.inner.block))
    }

    async fn client(&self) -> Client<'_> {
        let permit = self.inner.id_wait.acquire(1).await;
        let id = self.inner.ids.borrow_mut().pop().expect("an id per permit");
        Client {
            inner: &self.inner,
            id,
            _permit: permit,
        }
    }

    /// Element `i`: one RDMA READ when nobody is committing to it at that moment.
    pub async fn get(&self, i: u64) -> Result<T> {
        let (r, slot) = self.locate(i)?;
        if self.inner.layout.wide {
            Ok(self.read_wide(r, slot).await?.1)
        } else {
            Ok(from_word(r.ep.read(&r.block, slot).await?))
        }
    }

    /// Sets element `i` (under its lock, as an update that ignores the old value).
    pub async fn put(&self, i: u64, v: T) -> Result<()> {
        if self.inner.layout.wide {
            self.update(i, |_| v).await.map(|_| ())
        } else {
            let (r, slot) = self.locate(i)?;
            r.alive()?;
            r.ep.swap(&r.block, slot, as_word(&v))
                .await
                .map(|_| ())
                .map_err(indeterminate)
        }
    }

    /// Replaces element `i` by `f(old)` atomically: no concurrent update, from any node, is
    /// lost. Returns the new value. `f` may run more than once (when another node committed
    /// first, or this node's lease was broken), so it must not have side effects.
    pub async fn update(&self, i: u64, mut f: impl FnMut(&T) -> T) -> Result<T> {
        let (r, slot) = self.locate(i)?;
        if !self.inner.layout.wide {
            let mut cur = r.ep.read(&r.block, slot).await?;
            loop {
                let new = as_word(&f(&from_word(cur)));
                r.alive()?;
                let old =
                    r.ep.compare_and_swap(&r.block, slot, cur, new)
                        .await
                        .map_err(indeterminate)?;
                if old == cur {
                    return Ok(from_word(new));
                }
                cur = old;
            }
        }
        match self.inner.opts.broken {
            Some(Broken::NoLock) => return self.update_unlocked(r, slot, f).await,
            Some(Broken::TornWrites) => return self.update_in_place(r, slot, f).await,
            None => {}
        }
        let client = self.client().await;
        let base = slot * self.inner.layout.stride as u64;
        let mut watched: Option<(LockWord, Instant)> = None;
        let mut spins = 0;
        loop {
            let (w, cur) = self.read_wide(r, slot).await?;
            let mine = match w.owner() {
                FREE => w.acquired_by(client.id),
                APPLYING => {
                    backoff(&mut spins).await;
                    continue;
                }
                _ => match watched {
                    Some((seen, since)) if seen == w => {
                        if since.elapsed() < self.inner.opts.lease {
                            backoff(&mut spins).await;
                            continue;
                        }
                        // Held, unchanged, for a whole lease: the holder is gone or stopped.
                        self.inner.breaks.set(self.inner.breaks.get() + 1);
                        w.acquired_by(client.id)
                    }
                    _ => {
                        watched = Some((w, Instant::now()));
                        backoff(&mut spins).await;
                        continue;
                    }
                },
            };
            let old = r.ep.compare_and_swap(&r.block, base, w.0, mine.0).await?;
            if old != w.0 {
                continue;
            }
            let new = f(&cur);
            match self.commit(r, slot, mine, &new).await? {
                Outcome::Applied => return Ok(new),
                // Our lease was broken before the home saw the commit: nothing of it is
                // visible; start again from the value as it is now.
                Outcome::Fenced => {
                    self.inner.fenced.set(self.inner.fenced.get() + 1);
                    watched = None;
                    continue;
                }
                Outcome::Refused(why) => {
                    return Err(Error::Malformed(format!(
                        "the home refused a commit: {why}"
                    )))
                }
            }
        }
    }

    /// A whole, current copy of a wide slot (retrying while a commit is being applied).
    async fn read_wide(&self, r: &Remote, slot: u64) -> Result<(LockWord, T)> {
        let l = self.inner.layout;
        let mut spins = 0;
        loop {
            let words =
                r.ep.read_slice(&r.block, slot * l.stride as u64, l.stride as u64)
                    .await?;
            if self.inner.opts.broken == Some(Broken::TornWrites) {
                return Ok(l.decode_unchecked(&words));
            }
            match l.decode::<T>(&words) {
                (w, Some(v)) => return Ok((w, v)),
                (_, None) => backoff(&mut spins).await,
            }
        }
    }

    async fn commit(&self, r: &Remote, slot: u64, lock: LockWord, v: &T) -> Result<Outcome> {
        r.alive()?;
        let (req, answer) = r.pending.start()?;
        let msg = Msg::Commit {
            req,
            slot,
            lock: lock.0,
            data: bytemuck::bytes_of(v).to_vec(),
        };
        if let Err(e) = r.commits.send(&msg).await {
            r.pending.forget(req);
            return Err(indeterminate(e));
        }
        let lost = || {
            Error::Indeterminate(format!(
                "the connection to rank {} failed before it answered a commit",
                self.home_of_remote(r)
            ))
        };
        // The answer normally comes within a round trip. A home that is stopped (or cut off)
        // has its kernel acknowledge the bytes all the same, so nothing would ever fail: after
        // a while without an answer, probe it with a flush (a READ, which only the home's own
        // progress answers), which the provider fails within its fault bound if it is gone.
        let mut answer = answer;
        let deadline = Instant::now() + ANSWER_DEADLINE;
        loop {
            match time::timeout(ANSWER_PROBE, &mut answer).await {
                Ok(Ok(outcome)) => return Ok(outcome),
                Ok(Err(_)) => return Err(lost()),
                Err(_) => {
                    if r.commits.flush().await.is_err() {
                        r.pending.forget(req);
                        return Err(lost());
                    }
                    if Instant::now() >= deadline {
                        r.pending.forget(req);
                        return Err(Error::Indeterminate(format!(
                            "rank {} did not answer a commit within {ANSWER_DEADLINE:?} (stopped \
                             or cut off?); it may still apply it",
                            self.home_of_remote(r)
                        )));
                    }
                }
            }
        }
    }

    fn home_of_remote(&self, r: &Remote) -> usize {
        self.inner
            .homes
            .iter()
            .position(|h| std::ptr::eq(h, r))
            .unwrap_or(usize::MAX)
    }

    /// Reads `count` elements from `start` into `dst` from element `dst_start`: for 8-byte
    /// elements one RDMA READ per home, straight into `dst`'s registered memory; for wider
    /// elements one READ of the slots per home, each element checked as `get` checks it (and
    /// read again alone when a commit was landing in it). Each element is a value it held,
    /// but the range is not one snapshot.
    pub async fn get_range(
        &self,
        start: u64,
        dst: &Region<T>,
        dst_start: usize,
        count: u64,
    ) -> Result<()> {
        self.check_range(start, count, dst.len(), dst_start)?;
        let l = self.inner.layout;
        for (home, slot, at, n) in self.chunks(start, count) {
            let r = &self.inner.homes[home];
            let to = dst_start + at as usize;
            if !l.wide {
                r.ep.read_into(&r.block, slot, &dst.buf, to * 8, n as usize * 8)
                    .await?;
                continue;
            }
            let words =
                r.ep.read_slice(&r.block, slot * l.stride as u64, n * l.stride as u64)
                    .await?;
            for k in 0..n as usize {
                let v = match l.decode::<T>(&words[k * l.stride..(k + 1) * l.stride]) {
                    (_, Some(v)) => v,
                    (_, None) => self.read_wide(r, slot + k as u64).await?.1,
                };
                dst.set(to + k, v);
            }
        }
        Ok(())
    }

    /// Writes `count` elements of `src` (from element `src_start`) to the array from `start`.
    /// For 8-byte elements one RDMA WRITE per home straight from `src`'s registered memory:
    /// like MPI_Put, it is not atomic against single-element operations on the same elements
    /// at the same time. Wider elements are written one by one as `put` writes them.
    pub async fn put_range(
        &self,
        start: u64,
        src: &Region<T>,
        src_start: usize,
        count: u64,
    ) -> Result<()> {
        self.check_range(start, count, src.len(), src_start)?;
        for (home, slot, at, n) in self.chunks(start, count) {
            let r = &self.inner.homes[home];
            let from = src_start + at as usize;
            if !self.inner.layout.wide {
                r.alive()?;
                r.ep.write_from(&r.block, slot, &src.buf, from * 8, n as usize * 8)
                    .await
                    .map_err(indeterminate)?;
                continue;
            }
            for k in 0..n {
                self.put(start + at + k, src.get(from + k as usize)).await?;
            }
        }
        Ok(())
    }

    fn check_range(
        &self,
        start: u64,
        count: u64,
        local_len: usize,
        local_start: usize,
    ) -> Result<()> {
        if start.checked_add(count).is_none_or(|e| e > self.inner.len) {
            return Err(Error::OutOfBounds {
                index: start,
                count,
                len: self.inner.len,
            });
        }
        if local_start as u64 + count > local_len as u64 {
            return Err(Error::OutOfBounds {
                index: local_start as u64,
                count,
                len: local_len as u64,
            });
        }
        Ok(())
    }

    /// (home, first slot there, offset within the range, elements) for each home a range
    /// covers.
    fn chunks(&self, start: u64, count: u64) -> Vec<(usize, u64, u64, u64)> {
        let b = self.inner.block;
        let mut out = Vec::new();
        let mut i = start;
        while i < start + count {
            let n = (b - i % b).min(start + count - i);
            out.push(((i / b) as usize, i % b, i - start, n));
            i += n;
        }
        out
    }

    /// Test-only broken variant: read, compute and send the commit without taking the lock
    /// (the broken home applies it whatever the lock word says).
    async fn update_unlocked(
        &self,
        r: &Remote,
        slot: u64,
        mut f: impl FnMut(&T) -> T,
    ) -> Result<T> {
        let (w, cur) = self.read_wide(r, slot).await?;
        let new = f(&cur);
        match self.commit(r, slot, w, &new).await? {
            Outcome::Applied => Ok(new),
            o => Err(Error::Malformed(format!("{o:?}"))),
        }
    }

    /// Test-only broken variant: write the new value in place, in two RDMA WRITEs, with no
    /// lock and no version.
    async fn update_in_place(
        &self,
        r: &Remote,
        slot: u64,
        mut f: impl FnMut(&T) -> T,
    ) -> Result<T> {
        let l = self.inner.layout;
        let (_, cur) = self.read_wide(r, slot).await?;
        let new = f(&cur);
        let words = l.encode(LockWord(0), 0, &new);
        let data = &words[2..2 + l.data_words()];
        let half = data.len() / 2;
        let base = slot * l.stride as u64 + 2;
        r.ep.write_slice(&r.block, base, &data[..half]).await?;
        r.ep.write_slice(&r.block, base + half as u64, &data[half..])
            .await?;
        Ok(new)
    }
}

/// Hooks for tests that play a lock holder which stops and comes back late.
impl<T: Pod> SharedArray<T> {
    /// Takes element `i`'s lock (wide elements) as a fresh owner and returns the lock word,
    /// without committing: a holder that then stops.
    #[doc(hidden)]
    pub async fn hold_lock_for_test(&self, i: u64) -> Result<u64> {
        let (r, slot) = self.locate(i)?;
        let client = self.client().await;
        let id = client.id;
        // The id stays taken: this "holder" never finishes.
        std::mem::forget(client);
        let base = slot * self.inner.layout.stride as u64;
        loop {
            let (w, _) = self.read_wide(r, slot).await?;
            if w.owner() != FREE {
                yield_now().await;
                continue;
            }
            let mine = w.acquired_by(id);
            if r.ep.compare_and_swap(&r.block, base, w.0, mine.0).await? == w.0 {
                return Ok(mine.0);
            }
        }
    }

    /// Sends a commit of `v` to element `i` under lock word `lock`, as a holder that comes
    /// back late would. True if the home applied it.
    #[doc(hidden)]
    pub async fn commit_for_test(&self, i: u64, lock: u64, v: T) -> Result<bool> {
        let (r, slot) = self.locate(i)?;
        Ok(self.commit(r, slot, LockWord(lock), &v).await? == Outcome::Applied)
    }
}

impl SharedArray<u64> {
    /// Atomically adds `add` to element `i` (one RDMA atomic); returns the old value.
    pub async fn fetch_add(&self, i: u64, add: u64) -> Result<u64> {
        let (r, slot) = self.locate(i)?;
        r.alive()?;
        r.ep.fetch_add(&r.block, slot, add)
            .await
            .map_err(indeterminate)
    }

    /// Atomically replaces element `i` by `new` if it holds `expected` (one RDMA atomic);
    /// returns the old value (the swap happened when it equals `expected`).
    pub async fn compare_and_swap(&self, i: u64, expected: u64, new: u64) -> Result<u64> {
        let (r, slot) = self.locate(i)?;
        r.alive()?;
        r.ep.compare_and_swap(&r.block, slot, expected, new)
            .await
            .map_err(indeterminate)
    }
}

/// A failure of an operation that changes remote memory once it was posted: the connection
/// went while it was in flight, so it may or may not have happened.
fn indeterminate(e: Error) -> Error {
    match e {
        Error::PeerGone(m) => Error::Indeterminate(m),
        e => e,
    }
}

impl Remote {
    /// Fails with `PeerGone` when the connection had already failed before an operation that
    /// changes memory is posted: then it certainly did not happen.
    fn alive(&self) -> Result<()> {
        match self.ep.failed() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Waiting for a lock or a landing commit: a few yields (the holder is usually a round trip
/// from done), then sleeps growing from 20 us to 160 us.
async fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 4 {
        yield_now().await;
    } else {
        time::sleep(Duration::from_micros(20 << (*spins - 4).min(3))).await;
    }
}

fn as_word<T: Pod>(v: &T) -> u64 {
    let mut w = 0u64;
    bytemuck::bytes_of_mut(&mut w).copy_from_slice(bytemuck::bytes_of(v));
    w
}

fn from_word<T: Pod>(w: u64) -> T {
    let mut v = T::zeroed();
    bytemuck::bytes_of_mut(&mut v).copy_from_slice(bytemuck::bytes_of(&w));
    v
}
