//! UDP sockets on the engine.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::net::addr::socket_addr;
use crate::op::{datagram, SharedFd};

/// A UDP socket whose sends and receives go through the core's io_uring (one `SENDMSG` or
/// `RECVMSG` each), or through epoll readiness on the fallback reactor. Buffers are owned by the
/// operation while it is in flight, as for TCP.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::net::UdpSocket;
/// rt.block_on(async {
///     let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
///     let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
///     let (r, _) = a.send_to(b"ping".to_vec(), b.local_addr().unwrap()).await;
///     assert_eq!(r.unwrap(), 4);
///     let (r, buf) = b.recv_from(Vec::with_capacity(64)).await;
///     let (n, from) = r.unwrap();
///     assert_eq!((&buf[..n], from), (&b"ping"[..], a.local_addr().unwrap()));
/// });
/// ```
pub struct UdpSocket {
    fd: SharedFd,
}

impl UdpSocket {
    /// Binds to `addr` (port 0: any free port).
    pub fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
        let s = std::net::UdpSocket::bind(addr)?;
        s.set_nonblocking(true)?;
        Ok(UdpSocket {
            fd: SharedFd::new(OwnedFd::from(s)),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        socket_addr(self.fd.raw(), false)
    }

    /// Sends `buf`'s initialised bytes as one datagram to `to`.
    pub async fn send_to<B: IoBuf>(&self, buf: B, to: SocketAddr) -> BufResult<usize, B> {
        datagram::send_to(&self.fd, buf, to).await
    }

    /// Receives one datagram into `buf` (up to its capacity; a longer one is cut): its length
    /// and its sender. Dropping the future while it waits cancels the receive; on io_uring a
    /// datagram that arrives before the cancellation takes effect is consumed by it and lost,
    /// as UDP may lose any datagram.
    pub async fn recv_from<B: IoBufMut>(&self, buf: B) -> BufResult<(usize, SocketAddr), B> {
        datagram::recv_from(&self.fd, buf).await
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.raw()
    }
}
