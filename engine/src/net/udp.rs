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
        UdpSocket::bind_with(addr, SharedFd::new)
    }

    /// Binds as [`bind`](Self::bind) does, for control traffic (gossip, heartbeats) that can
    /// be taken some microseconds late: under the epoll reactor a task waiting on this socket
    /// is a relaxed waiter (see [`poll_readable_relaxed`](crate::poll_readable_relaxed)), so a
    /// busy core does not ask the kernel for events on every pass for it. Under io_uring it is
    /// the same socket as `bind`'s.
    ///
    /// ```
    /// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
    /// use barewire_engine::net::UdpSocket;
    /// rt.block_on(async {
    ///     let gossip = UdpSocket::bind_relaxed("127.0.0.1:0".parse().unwrap()).unwrap();
    ///     let peer = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    ///     let (r, _) = peer.send_to(b"alive".to_vec(), gossip.local_addr().unwrap()).await;
    ///     r.unwrap();
    ///     let (r, buf) = gossip.recv_from(Vec::with_capacity(64)).await;
    ///     assert_eq!(&buf[..r.unwrap().0], b"alive");
    /// });
    /// ```
    pub fn bind_relaxed(addr: SocketAddr) -> io::Result<UdpSocket> {
        UdpSocket::bind_with(addr, SharedFd::relaxed)
    }

    fn bind_with(addr: SocketAddr, fd: fn(OwnedFd) -> SharedFd) -> io::Result<UdpSocket> {
        let s = std::net::UdpSocket::bind(addr)?;
        s.set_nonblocking(true)?;
        Ok(UdpSocket {
            fd: fd(OwnedFd::from(s)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::epoll::Epoll;

    /// Under epoll, a task waiting in `recv_from` on a `bind_relaxed` socket is a relaxed
    /// waiter (it does not make a busy core ask the kernel on every pass) and still gets its
    /// datagram; on a `bind` socket it is an ordinary one.
    #[test]
    fn a_relaxed_socket_waits_relaxed_under_epoll() {
        Epoll::test_runtime().block_on(async {
            let counts = Epoll::waiters_here;
            let sender = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            for relaxed in [true, false] {
                let any = "127.0.0.1:0".parse().unwrap();
                let s = if relaxed {
                    UdpSocket::bind_relaxed(any)
                } else {
                    UdpSocket::bind(any)
                }
                .unwrap();
                let at = s.local_addr().unwrap();
                let before = counts();
                let recv = crate::spawn_local(async move {
                    let (r, buf) = s.recv_from(Vec::with_capacity(16)).await;
                    r.map(|(n, _)| buf[..n].to_vec())
                });
                crate::yield_now().await;
                let want = if relaxed {
                    (before.0, before.1 + 1)
                } else {
                    (before.0 + 1, before.1)
                };
                assert_eq!(counts(), want, "relaxed: {relaxed}");
                let (r, _) = sender.send_to(b"alive".to_vec(), at).await;
                r.unwrap();
                let got = crate::time::timeout(std::time::Duration::from_secs(5), recv)
                    .await
                    .expect("the datagram is taken")
                    .unwrap()
                    .unwrap();
                assert_eq!(got, b"alive");
                assert_eq!(counts(), before);
            }
        });
    }
}
