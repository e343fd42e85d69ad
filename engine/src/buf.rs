//! Buffers that operations own while the kernel uses them.
//!
//! An I/O call takes its buffer by value and gives it back with the result, as in tokio-uring
//! and monoio: `let (res, buf) = stream.read(buf).await;`. If the future is dropped while the
//! kernel still holds the operation, the buffer is parked in the reactor until the completion
//! arrives, so it is never freed or reused under the kernel's feet.

use std::io;

/// The result of an owned-buffer operation: the outcome, and the buffer back.
pub type BufResult<T, B> = (io::Result<T>, B);

/// A buffer the kernel may read from.
///
/// # Safety
/// `stable_ptr` must point at `bytes_init` readable bytes that do not move when the value is
/// moved (heap memory), and stay valid until the value is dropped.
pub unsafe trait IoBuf: Unpin + 'static {
    /// Start of the memory.
    fn stable_ptr(&self) -> *const u8;
    /// Bytes holding data (what a write sends).
    fn bytes_init(&self) -> usize;
    /// Bytes of capacity (what a read may fill).
    fn bytes_total(&self) -> usize;
}

/// A buffer the kernel may write into.
///
/// # Safety
/// As [`IoBuf`], and `stable_mut_ptr` points at `bytes_total` writable bytes.
pub unsafe trait IoBufMut: IoBuf {
    /// Start of the writable memory.
    fn stable_mut_ptr(&mut self) -> *mut u8;
    /// Records that the first `n` bytes now hold data.
    ///
    /// # Safety
    /// The first `n` bytes must have been written.
    unsafe fn set_init(&mut self, n: usize);
}

// SAFETY: a Vec's heap buffer does not move when the Vec does; len/capacity bound it.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
}

// SAFETY: as above; set_len within capacity after the kernel wrote n bytes.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, n: usize) {
        if n > self.len() {
            // SAFETY: caller guarantees n bytes were written, and n <= capacity.
            unsafe { self.set_len(n) };
        }
    }
}

// SAFETY: boxed slice memory is on the heap and fixed-size.
unsafe impl IoBuf for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: as above.
unsafe impl IoBufMut for Box<[u8]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}

// SAFETY: 'static data never moves or goes away.
unsafe impl IoBuf for &'static [u8] {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: as above.
unsafe impl IoBuf for &'static str {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

pub use crate::op::recv_provided::{BufRing, ProvidedBuf, RecvMulti};
