use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::TcpStream;
use crate::net::addr::socket_addr;
use crate::op::accept::{self, Incoming as RawIncoming};
use crate::op::SharedFd;

/// A listening TCP socket.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::net::{TcpListener, TcpStream};
/// rt.block_on(async {
///     let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
///     let addr = l.local_addr().unwrap();
///     let mut incoming = l.incoming(); // one multishot accept on io_uring
///     let _c1 = TcpStream::connect(addr).await.unwrap();
///     let _c2 = TcpStream::connect(addr).await.unwrap();
///     let s1 = incoming.next().await.unwrap();
///     let s2 = incoming.next().await.unwrap();
///     assert_ne!(s1.peer_addr().unwrap(), s2.peer_addr().unwrap());
/// });
/// ```
pub struct TcpListener {
    fd: SharedFd,
}

impl TcpListener {
    /// Binds and listens (backlog 1024, `SO_REUSEADDR` as std sets it).
    pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let fd = OwnedFd::from(l);
        // SAFETY: plain syscall on a listening socket we own; raises std's backlog of 128.
        unsafe { libc::listen(fd.as_raw_fd(), 1024) };
        Ok(TcpListener {
            fd: SharedFd::relaxed(fd),
        })
    }

    /// Accepts one connection.
    ///
    /// Under the epoll reactor a task waiting here does not make a busy core ask the kernel for
    /// events on every pass: the listener is looked at once every few dozen passes (and at
    /// once by a sleeping core), so a connection may be taken some microseconds after it
    /// arrives. See [`poll_readable_relaxed`](crate::poll_readable_relaxed).
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (fd, addr) = accept::accept(&self.fd).await?;
        Ok((TcpStream::from_owned(fd)?, addr))
    }

    /// A stream of connections: on io_uring one multishot accept serves them all. Its waits
    /// under epoll are relaxed, as [`accept`](Self::accept)'s are.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming {
            listener: self,
            raw: RawIncoming::new(),
        }
    }

    /// The bound address (useful after binding port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        socket_addr(self.fd.raw(), false)
    }
}

impl AsRawFd for TcpListener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.raw()
    }
}

/// See [`TcpListener::incoming`].
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::net::{TcpListener, TcpStream};
/// use barewire_engine::spawn_local;
/// rt.block_on(async {
///     let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
///     let at = l.local_addr().unwrap();
///     let clients = spawn_local(async move {
///         for _ in 0..3 {
///             let s = TcpStream::connect(at).await.unwrap();
///             let (r, _) = s.write_all(b"hi".to_vec()).await;
///             r.unwrap();
///         }
///     });
///     let mut incoming = l.incoming(); // one multishot accept on io_uring
///     for _ in 0..3 {
///         let s = incoming.next().await.unwrap();
///         let (r, buf) = s.read_exact(vec![0u8; 2]).await;
///         r.unwrap();
///         assert_eq!(buf, b"hi");
///     }
///     clients.await.unwrap();
/// });
/// ```
pub struct Incoming<'a> {
    listener: &'a TcpListener,
    raw: RawIncoming,
}

impl Incoming<'_> {
    /// The next accepted connection.
    pub async fn next(&mut self) -> io::Result<TcpStream> {
        let (fd, _) = self.raw.next(&self.listener.fd).await?;
        TcpStream::from_owned(fd)
    }
}

/// Whether an error from accept(2) says "not now" rather than "never": out of descriptors or
/// memory for a moment, or a connection that went away while it waited. A listener backs off
/// and tries again (the connection stays in the kernel's backlog); any other error means the
/// listening socket itself is unusable.
///
/// ```
/// use barewire_engine::net::accept_error_is_transient;
/// assert!(accept_error_is_transient(&std::io::Error::from_raw_os_error(libc::EMFILE)));
/// assert!(!accept_error_is_transient(&std::io::Error::from_raw_os_error(libc::EBADF)));
/// ```
pub fn accept_error_is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::ECONNABORTED
                | libc::EINTR
                | libc::EPROTO
                | libc::EPERM
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::epoll::Epoll;

    /// Under epoll, a task waiting in `accept` is a relaxed waiter: it does not make a busy
    /// core ask the kernel on every pass (`Epoll::poll`), and the connection is still taken.
    /// A plain registration would count it in `waiting`.
    #[test]
    fn a_waiting_accept_is_a_relaxed_wait_under_epoll() {
        Epoll::test_runtime().block_on(async {
            let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let at = l.local_addr().unwrap();
            let counts = Epoll::waiters_here;
            let before = counts();
            let accept = crate::spawn_local(async move { l.accept().await.map(|(_, a)| a) });
            crate::yield_now().await;
            let (waiting, relaxed) = counts();
            assert_eq!((waiting, relaxed), (before.0, before.1 + 1));
            let c = std::net::TcpStream::connect(at).unwrap();
            let from = crate::time::timeout(std::time::Duration::from_secs(5), accept)
                .await
                .expect("the connection is taken")
                .unwrap()
                .unwrap();
            assert_eq!(from, c.local_addr().unwrap());
            assert_eq!(counts(), before);
        });
    }
}
