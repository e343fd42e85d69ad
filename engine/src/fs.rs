//! Positional file I/O with owned buffers.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::op::rw;
use crate::pool::FixedBuf;

/// An open file whose reads and writes go through the core's reactor.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let path = std::env::temp_dir().join(format!("bw-doc-{}", std::process::id()));
///     let f = barewire_engine::fs::File::create(&path).unwrap();
///     f.write_at(b"hello".to_vec(), 0).await.0.unwrap();
///     let (n, buf) = f.read_at(vec![0u8; 16], 0).await;
///     assert_eq!(&buf[..n.unwrap()], b"hello");
///     std::fs::remove_file(path).unwrap();
/// });
/// ```
pub struct File {
    fd: OwnedFd,
}

impl File {
    /// Opens for reading.
    pub fn open(path: impl AsRef<Path>) -> io::Result<File> {
        Ok(File {
            fd: std::fs::File::open(path)?.into(),
        })
    }

    /// Creates (or truncates) for reading and writing.
    pub fn create(path: impl AsRef<Path>) -> io::Result<File> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(File { fd: f.into() })
    }

    /// Adopts a std file.
    pub fn from_std(f: std::fs::File) -> File {
        File { fd: f.into() }
    }

    /// Reads at `pos` into `buf` (from its start, up to its capacity).
    pub async fn read_at<B: IoBufMut>(&self, buf: B, pos: u64) -> BufResult<usize, B> {
        rw::read_at(self.fd.as_raw_fd(), buf, pos).await
    }

    /// Writes `buf`'s initialised bytes at `pos`.
    pub async fn write_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<usize, B> {
        rw::write_at(self.fd.as_raw_fd(), buf, pos).await
    }

    /// Reads into a registered buffer (`IORING_OP_READ_FIXED`: no page pinning per call).
    pub async fn read_fixed_at(&self, buf: FixedBuf, pos: u64) -> BufResult<usize, FixedBuf> {
        rw::read_fixed_at(self.fd.as_raw_fd(), buf, pos).await
    }

    /// Writes from a registered buffer (`IORING_OP_WRITE_FIXED`).
    pub async fn write_fixed_at(&self, buf: FixedBuf, pos: u64) -> BufResult<usize, FixedBuf> {
        rw::write_fixed_at(self.fd.as_raw_fd(), buf, pos).await
    }
}

impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
