use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::buf::{BufResult, BufRing, IoBuf, IoBufMut, ProvidedBuf, RecvMulti};
use crate::net::addr::socket_addr;
use crate::op::{self, SharedFd};

/// A TCP connection owned by one core.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::net::{TcpListener, TcpStream};
/// rt.block_on(async {
///     let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
///     let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
///     let (s, _) = l.accept().await.unwrap();
///     // A header and a payload from separate buffers, one syscall.
///     let (r, _) = c.writev(vec![b"head:".to_vec(), b"body".to_vec()]).await;
///     assert_eq!(r.unwrap(), 9);
///     let (r, buf) = s.read_exact(vec![0u8; 9]).await;
///     r.unwrap();
///     assert_eq!(&buf, b"head:body");
/// });
/// ```
pub struct TcpStream {
    fd: SharedFd,
}

impl TcpStream {
    pub(crate) fn from_owned(fd: OwnedFd) -> io::Result<TcpStream> {
        let s = TcpStream {
            fd: SharedFd::new(fd),
        };
        s.set_nodelay(true)?;
        Ok(s)
    }

    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        let fd = op::connect::socket(&addr)?;
        let shared = SharedFd::new(fd);
        op::connect::connect(&shared, addr).await?;
        let s = TcpStream { fd: shared };
        s.set_nodelay(true)?;
        Ok(s)
    }

    /// Adopts a std stream (switched to non-blocking).
    pub fn from_std(s: std::net::TcpStream) -> io::Result<TcpStream> {
        s.set_nonblocking(true)?;
        TcpStream::from_owned(OwnedFd::from(s))
    }

    /// Reads once into `buf` (from its start, up to its capacity). `Ok(0)` is end of stream.
    pub async fn read<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        op::recv::recv(&self.fd, buf, 0).await
    }

    /// Reads until `buf` is full (`bytes_total` bytes, its capacity for a `Vec`), straight into
    /// it; end of stream first is `UnexpectedEof`.
    pub async fn read_exact<B: IoBufMut>(&self, mut buf: B) -> BufResult<(), B> {
        let want = buf.bytes_total();
        let mut filled = 0;
        while filled < want {
            let (r, b) = op::recv::recv(&self.fd, buf, filled).await;
            buf = b;
            match r {
                Ok(0) => return (Err(io::ErrorKind::UnexpectedEof.into()), buf),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Reads once into a buffer the kernel picks from `ring` (a provided-buffer ring). An empty
    /// buffer means end of stream.
    pub async fn recv_provided(&self, ring: &BufRing) -> io::Result<ProvidedBuf> {
        op::recv_provided::recv_provided(&self.fd, ring).await
    }

    /// Receives into buffers of `ring` through one multishot receive that stays armed between
    /// calls (on io_uring; one `recv` per call on epoll): no submission per read.
    /// A `ProvidedBuf` can be sent back as is (it is an [`IoBuf`]); it returns to the ring when
    /// dropped.
    ///
    /// ```
    /// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
    /// use barewire_engine::{buf::BufRing, net::{TcpListener, TcpStream}};
    /// rt.block_on(async {
    ///     let ring = BufRing::new(16, 4096).unwrap();
    ///     let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    ///     let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    ///     let (s, _) = l.accept().await.unwrap();
    ///     let mut rx = s.recv_multi(&ring);
    ///     for word in [&b"one"[..], b"two"] {
    ///         c.write_all(word.to_vec()).await.0.unwrap();
    ///         let got = rx.next().await.unwrap().unwrap();
    ///         assert_eq!(&*got, word);
    ///         s.write_all(got).await.0.unwrap(); // echoed from the ring's buffer
    ///         let (r, back) = c.read_exact(vec![0u8; 3]).await;
    ///         r.unwrap();
    ///         assert_eq!(back, word);
    ///     }
    ///     drop(c);
    ///     assert!(rx.next().await.unwrap().unwrap().is_empty()); // end of stream
    ///     assert!(rx.next().await.is_none());
    /// });
    /// ```
    pub fn recv_multi(&self, ring: &BufRing) -> RecvMulti<'_> {
        RecvMulti::new(&self.fd, ring)
    }

    /// Writes once; it may write less than the whole buffer.
    pub async fn write<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        op::send::send(&self.fd, buf, 0).await
    }

    /// Writes the whole buffer.
    pub async fn write_all<B: IoBuf>(&self, mut buf: B) -> BufResult<(), B> {
        let total = buf.bytes_init();
        let mut done = 0;
        while done < total {
            let (r, b) = op::send::send(&self.fd, buf, done).await;
            buf = b;
            match r {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Writes the buffers in order with one gather call (`sendmsg`); it may write less than all.
    pub async fn writev<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        op::writev::writev(&self.fd, bufs).await
    }

    /// Zero-copy send (`IORING_OP_SEND_ZC`): the kernel sends straight from `buf`'s pages and
    /// hands it back once the network stack has released them. Worth it for large buffers
    /// (tens of KiB and up); for small ones the notification costs more than the copy saves.
    pub async fn send_zc<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        op::send_zc::send_zc(&self.fd, buf).await
    }

    /// Takes the socket out of the reactor, for a protocol engine that drives it itself (the
    /// software RDMA provider does). The fd stays non-blocking.
    pub fn into_fd(self) -> OwnedFd {
        self.fd.into_owned()
    }

    /// Sets `TCP_NODELAY` (on by default).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        setsockopt(
            self.fd.raw(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            on as libc::c_int,
        )
    }

    /// Reads `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(getsockopt_int(self.fd.raw(), libc::IPPROTO_TCP, libc::TCP_NODELAY)? != 0)
    }

    /// Fails the connection when nothing has been heard from the peer's host for `within`
    /// (`None`: never, the kernel's default). The kernel probes an idle connection (TCP
    /// keepalive) and the peer's kernel answers, so a peer whose process is stopped, or whose
    /// core is busy, still counts as heard; a cut link or a host that is gone does not. The
    /// same bound applies to sent data left unacknowledged, and to data the peer's full receive
    /// window has kept unsent (`TCP_USER_TIMEOUT`). Once it fails, reads and writes return
    /// `ETIMEDOUT`. The bound is kept to within about a tenth of it (at least a second): probes
    /// start after a third of it and go out every tenth.
    ///
    /// ```
    /// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
    /// use std::time::Duration;
    /// use barewire_engine::net::{TcpListener, TcpStream};
    /// rt.block_on(async {
    ///     let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    ///     let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    ///     c.set_keepalive(Some(Duration::from_secs(10))).unwrap();
    ///     assert_eq!(c.keepalive().unwrap(), Some(Duration::from_secs(10)));
    ///     c.set_keepalive(None).unwrap();
    ///     assert_eq!(c.keepalive().unwrap(), None);
    /// });
    /// ```
    pub fn set_keepalive(&self, within: Option<Duration>) -> io::Result<()> {
        set_keepalive(self.fd.raw(), within)
    }

    /// The bound [`set_keepalive`](Self::set_keepalive) set (`None` when keepalive is off).
    pub fn keepalive(&self) -> io::Result<Option<Duration>> {
        let fd = self.fd.raw();
        if getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE)? == 0 {
            return Ok(None);
        }
        let ms = getsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT)?;
        Ok(Some(Duration::from_millis(ms as u64)))
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        socket_addr(self.fd.raw(), false)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        socket_addr(self.fd.raw(), true)
    }

    /// Shuts down one or both directions.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let how = match how {
            Shutdown::Read => libc::SHUT_RD,
            Shutdown::Write => libc::SHUT_WR,
            Shutdown::Both => libc::SHUT_RDWR,
        };
        // SAFETY: plain syscall on our fd.
        if unsafe { libc::shutdown(self.fd.raw(), how) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.raw()
    }
}

pub(crate) fn getsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v is a c_int buffer of len bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Whether [`TcpStream::set_keepalive`] can keep `within` (at least 1 s, as the kernel's
/// probes count whole seconds, and at most what `TCP_USER_TIMEOUT` holds, about 24 days): for
/// code that takes the setting long before it has a socket. Returns the bound in milliseconds.
///
/// ```
/// use std::time::Duration;
/// use barewire_engine::net::check_keepalive;
/// assert_eq!(check_keepalive(Duration::from_secs(2)).unwrap(), 2000);
/// assert!(check_keepalive(Duration::from_millis(500)).is_err());
/// ```
pub fn check_keepalive(within: Duration) -> io::Result<libc::c_int> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a keepalive bound of {within:?}: {why}"),
        )
    };
    if within < Duration::from_secs(1) {
        return Err(bad(
            "the kernel's probes count whole seconds, so it must be at least 1 s",
        ));
    }
    libc::c_int::try_from(within.as_millis())
        .map_err(|_| bad("longer than TCP_USER_TIMEOUT holds (2^31 - 1 ms, about 24 days)"))
}

/// See [`TcpStream::set_keepalive`].
fn set_keepalive(fd: RawFd, within: Option<Duration>) -> io::Result<()> {
    let Some(within) = within else {
        setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 0)?;
        return setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 0);
    };
    let ms = check_keepalive(within)?;
    // Whole seconds, as the kernel counts them: the first probe after a third of the bound,
    // the next ones every tenth (at least one second apart, and each at most the kernel's
    // 32,767 s). The abort itself comes from TCP_USER_TIMEOUT, checked at each probe, so the
    // count only needs to outlast it.
    const KERNEL_MAX: libc::c_int = 32_767; // MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL
    let secs = within.as_secs() as libc::c_int;
    let idle = (secs / 3).clamp(1, KERNEL_MAX);
    let interval = (secs / 10).clamp(1, KERNEL_MAX);
    let count = ((secs - idle) / interval + 2).min(127);
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, count)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms)?;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)
}

pub(crate) fn setsockopt(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: v is a c_int of the stated size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStream")
            .field("fd", &self.fd.raw())
            .field("peer", &self.peer_addr().ok())
            .finish()
    }
}
