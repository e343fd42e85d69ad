//! The ring path under SQPOLL (`barewire_engine::Builder::sqpoll`, `BAREWIRE_SQPOLL`).
//!
//! There a kernel thread reads the submission queue on its own time, so nothing the kernel is
//! told about may depend on being carried out inside our own `io_uring_enter` (see
//! `ring.rs`, whose operations do). Per queue pair, a [`Wire`] owns everything its operations
//! name until their last completion:
//! - **its own descriptor of the socket** (a `dup`), so a queue pair dropped before the kernel
//!   thread reads an entry cannot have that entry act on a new socket that reused the number;
//! - **sends from copies**: what the stream has queued is copied into the wire's buffer (the
//!   stream counts it as handed over, as it would bytes handed to TCP) and sent with
//!   `MSG_WAITALL`, one send at a time so the bytes keep their order. What the stream queues
//!   meanwhile is copied behind it and goes next. A queue pair that closes shuts its socket down
//!   only after the copies went out, so nothing it acknowledged is lost, and a queue pair
//!   dropped with copies still to send leaves them to the wire;
//! - **receives only into the ring's provided buffers** (the multishot receive), never straight
//!   into a region: a region may be deregistered between our push and the kernel's write.
//!
//! The wire goes once its queue pair is gone and its last operation has completed.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};

use barewire_engine::uring::{opcode, types};

use super::ring::Ring;

/// Bytes copied out of one stream ahead of the kernel (the rest waits in the stream).
const COPY_MAX: usize = 4 << 20;

/// One queue pair's state under SQPOLL (see the module doc).
pub(super) struct Wire {
    fd: OwnedFd,
    /// Operations pushed whose last completion has not come.
    inflight: u32,
    /// The copy being sent, and how much of it went already.
    sending: Option<Vec<u8>>,
    sent: usize,
    /// Bytes copied after it, sent when it completes.
    next: Vec<u8>,
    /// The last sent copy's allocation, for the next one.
    spare: Vec<u8>,
    /// Shut the socket down once everything copied has gone.
    hangup: bool,
    /// It was shut down.
    shut: bool,
    /// The queue pair is gone.
    detached: bool,
}

/// The wires of a core, by queue pair (its token with the kind bits clear).
#[derive(Default)]
pub(super) struct Wires {
    map: HashMap<u64, Wire>,
}

impl Wire {
    /// Sends the rest of the copy in flight.
    fn push_send(&mut self, r: &Ring, token: u64) {
        let Some(buf) = self.sending.as_ref() else {
            return;
        };
        let rest = &buf[self.sent..];
        let e = opcode::Send::new(
            types::Fd(self.fd.as_raw_fd()),
            rest.as_ptr(),
            rest.len() as u32,
        )
        .flags(libc::MSG_WAITALL | libc::MSG_NOSIGNAL)
        .build();
        // SAFETY: the copy is owned by the wire until this send's completion (or leaked with
        // the ring), and the descriptor by the wire until its last operation completed.
        unsafe { r.raw.push(e, token) };
        self.inflight += 1;
    }
}

impl Drop for Wires {
    fn drop(&mut self) {
        // The ring goes with the core; a send still in flight may be read by the kernel until
        // its teardown completes, so its copy is leaked rather than freed under it.
        for w in self.map.values_mut() {
            if let Some(b) = w.sending.take() {
                std::mem::forget(b);
            }
        }
    }
}

impl Wires {
    /// A wire for a new queue pair, over a duplicate of its socket. The socket becomes
    /// blocking (the flag belongs to the socket, not the descriptor): io_uring then waits for
    /// room itself and sends a whole copy (`MSG_WAITALL`), where on a non-blocking socket it
    /// would hand back `EAGAIN`. Nothing else makes system calls on it meanwhile.
    pub(super) fn open(&mut self, id: u64, fd: &OwnedFd) -> std::io::Result<()> {
        let fd = fd.try_clone()?;
        // SAFETY: reading and setting the status flags of a socket we own.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0
                || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        self.map.insert(
            id,
            Wire {
                fd,
                inflight: 0,
                sending: None,
                sent: 0,
                next: Vec::new(),
                spare: Vec::new(),
                hangup: false,
                shut: false,
                detached: false,
            },
        );
        Ok(())
    }

    /// The descriptor the queue pair's operations use.
    pub(super) fn fd(&self, id: u64) -> Option<types::Fd> {
        self.map.get(&id).map(|w| types::Fd(w.fd.as_raw_fd()))
    }

    /// An operation of `id` was pushed.
    pub(super) fn pushed(&mut self, id: u64) {
        if let Some(w) = self.map.get_mut(&id) {
            w.inflight += 1;
        }
    }

    /// An operation of `id` had its last completion.
    pub(super) fn finished(&mut self, id: u64) {
        if let Some(w) = self.map.get_mut(&id) {
            w.inflight = w.inflight.saturating_sub(1);
        }
        self.reap(id);
    }

    /// Copies what the stream has queued behind what the wire holds (up to [`COPY_MAX`]), and
    /// counts it as handed over. False if the stream stopped (a Read Response's source is
    /// gone), as `tx_iovecs` says.
    pub(super) fn take(&mut self, id: u64, stream: &mut crate::stream::Stream) -> bool {
        let Some(w) = self.map.get_mut(&id) else {
            return true;
        };
        while stream.wants_tx() && w.next.len() < COPY_MAX {
            let mut slices = [std::io::IoSlice::new(&[]); 64];
            let count = stream.tx_iovecs(&mut slices);
            if count == 0 {
                return false;
            }
            let mut took = 0;
            for s in &slices[..count] {
                w.next.extend_from_slice(s);
                took += s.len();
            }
            stream.tx_advance(took);
        }
        true
    }

    /// Starts the send of what was copied, if none is in flight. True if one started.
    pub(super) fn kick(&mut self, id: u64, r: &Ring, token: u64) -> bool {
        let Some(w) = self.map.get_mut(&id) else {
            return false;
        };
        if w.sending.is_some() || w.next.is_empty() {
            return false;
        }
        let spare = std::mem::take(&mut w.spare);
        w.sending = Some(std::mem::replace(&mut w.next, spare));
        w.sent = 0;
        w.push_send(r, token);
        true
    }

    /// A send of `id` completed with `res`. False if the connection broke (what was still to
    /// go is dropped); a short send goes on from where it stopped.
    pub(super) fn sent(&mut self, id: u64, res: i32, r: &Ring, token: u64) -> bool {
        let Some(w) = self.map.get_mut(&id) else {
            return false;
        };
        w.inflight = w.inflight.saturating_sub(1);
        let len = w.sending.as_ref().map_or(0, Vec::len);
        let ok = res > 0 || (res == 0 && len == 0);
        if ok {
            w.sent += res as usize;
            if w.sent < len {
                w.push_send(r, token);
                return true;
            }
            if let Some(mut done) = w.sending.take() {
                done.clear();
                w.spare = done;
            }
            self.kick(id, r, token);
        } else {
            w.sending = None;
            w.next.clear();
        }
        self.shut_if_done(id);
        self.reap(id);
        ok
    }

    /// True while some wire has copies still to send.
    pub(super) fn sending(&self) -> bool {
        self.map
            .values()
            .any(|w| w.sending.is_some() || !w.next.is_empty())
    }

    /// The queue pair closed: its socket shuts down once what was copied has gone.
    pub(super) fn hang_up(&mut self, id: u64) {
        if let Some(w) = self.map.get_mut(&id) {
            w.hangup = true;
        }
        self.shut_if_done(id);
    }

    /// The queue pair is gone: the wire follows once its operations are done.
    pub(super) fn detach(&mut self, id: u64) {
        if let Some(w) = self.map.get_mut(&id) {
            w.detached = true;
            w.hangup = true;
        }
        self.shut_if_done(id);
        self.reap(id);
    }

    fn shut_if_done(&mut self, id: u64) {
        if let Some(w) = self.map.get_mut(&id) {
            if w.hangup && !w.shut && w.sending.is_none() && w.next.is_empty() {
                w.shut = true;
                // SAFETY: shutting down our own socket.
                unsafe { libc::shutdown(w.fd.as_raw_fd(), libc::SHUT_RDWR) };
            }
        }
    }

    fn reap(&mut self, id: u64) {
        if self
            .map
            .get(&id)
            .is_some_and(|w| w.detached && w.inflight == 0 && w.sending.is_none())
        {
            self.map.remove(&id);
        }
    }
}
