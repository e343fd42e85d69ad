//! The queue pair's control socket: an abstract Unix seqpacket socket (scoped to the network
//! namespace, named after the listener's TCP address: `barewire-shm/127.0.0.1:7000`, or
//! `barewire-shm/*:7000` for a listener on every address), which carries the setup messages and the
//! memory grants with their descriptors (SCM_RIGHTS), and whose hang-up tells a queue pair
//! that its peer is gone.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

/// Most descriptors one message carries.
const MAX_FDS: usize = 4;

/// A non-blocking seqpacket socket.
pub(crate) fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked and owned.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just created.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The name of the shm listener on TCP address `addr` (port and IP: the kernel gives a port
/// bound to one IP to another listener on another IP too, so a name of the port alone could
/// collide); an unspecified IP is `*`. An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) names
/// the IPv4 address it maps, as TCP connects it to the same listener.
pub(crate) fn name(addr: std::net::SocketAddr) -> String {
    let ip = addr.ip().to_canonical();
    if ip.is_unspecified() {
        format!("*:{}", addr.port())
    } else {
        std::net::SocketAddr::new(ip, addr.port()).to_string()
    }
}

/// The abstract address of the shm listener called `name`.
fn address(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("barewire-shm/{name}");
    // sun_path[0] stays 0: the abstract namespace.
    for (i, b) in name.bytes().enumerate() {
        a.sun_path[1 + i] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (a, len as libc::socklen_t)
}

/// Binds and listens on the abstract name `name`.
pub(crate) fn listen(fd: &OwnedFd, name: &str) -> io::Result<()> {
    let (a, len) = address(name);
    // SAFETY: a valid address of the given length.
    if unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Connects to the abstract name `name` (EAGAIN while the listener's backlog is full).
pub(crate) fn connect(fd: &OwnedFd, name: &str) -> io::Result<()> {
    let (a, len) = address(name);
    // SAFETY: a valid address of the given length.
    if unsafe { libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Accepts one connection, non-blocking; `None` if none is waiting.
pub(crate) fn accept(fd: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: accept4 on a listening socket; the result is checked and owned.
    let c = unsafe {
        libc::accept4(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    if c < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: a descriptor accept4 just gave us.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(c) }))
}

/// This process's user.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// The user of the process that listens on the abstract name `name`, if one does and takes a
/// connection now.
pub(crate) fn holder_uid(name: &str) -> Option<u32> {
    let fd = seqpacket().ok()?;
    connect(&fd, name).ok()?;
    peer_cred(&fd).ok().map(|c| c.uid)
}

/// The credentials (process, user, group) of the process at the other end, as it connected.
pub(crate) fn peer_cred(fd: &OwnedFd) -> io::Result<libc::ucred> {
    // SAFETY: ucred is plain data; getsockopt fills it and its length is checked.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// Sends one message with `fds` attached, without blocking (a full socket is an error: the
/// peer is not reading its control messages).
pub(crate) fn send(fd: RawFd, msg: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    send_any(fd, msg, fds)
}

/// As [`send`], with more descriptors than a message may carry (up to 16): what a peer that
/// breaks the protocol can send, for the tests.
pub(crate) fn send_any(fd: RawFd, msg: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    // Room for 16 descriptors, aligned for cmsghdr.
    let mut space = [0u64; 10];
    // SAFETY: msghdr is plain data.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE is arithmetic.
        let need = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        assert!(need <= std::mem::size_of_val(&space));
        h.msg_control = space.as_mut_ptr().cast();
        h.msg_controllen = need as _;
        // SAFETY: the control buffer holds one cmsghdr with `bytes` of data (checked above).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&h);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
    }
    // SAFETY: h points at live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(fd, &h, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One received message: its length (0: the peer hung up) and the descriptors it carried.
pub(crate) struct Received {
    pub len: usize,
    pub fds: Vec<OwnedFd>,
}

/// Receives one message into `buf` without blocking; `None` if none is waiting. A message
/// longer than `buf` or carrying too many descriptors is an error (and what it carried is
/// closed).
pub(crate) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<Received>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut space = [0u64; 8];
    // SAFETY: msghdr is plain data.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    h.msg_control = space.as_mut_ptr().cast();
    h.msg_controllen = std::mem::size_of_val(&space) as _;
    // SAFETY: h points at live buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(fd, &mut h, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        };
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `space`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..n {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&h, c);
        }
    }
    if h.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "an oversized control message",
        ));
    }
    Ok(Some(Received {
        len: n as usize,
        fds,
    }))
}

/// Waits (through the reactor) for one message until `deadline`.
pub(crate) async fn recv_by(fd: RawFd, buf: &mut [u8], deadline: Instant) -> io::Result<Received> {
    loop {
        if let Some(r) = recv(fd, buf)? {
            return Ok(r);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"));
        }
        let _ = barewire_engine::time::timeout(left, barewire_engine::poll_readable(fd)).await;
    }
}

/// A non-blocking eventfd (the core's wake-up descriptor).
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain eventfd(2); the result is checked and owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just created.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Checks that a descriptor a peer sent as its wake-up is an eventfd, and makes it
/// non-blocking: anything else (a pipe it never drains, say) could block this core on a write.
pub(crate) fn check_eventfd(fd: &OwnedFd) -> io::Result<()> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the peer's wake-up descriptor is {}, not an eventfd",
                link.display()
            ),
        ));
    }
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    let set = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if flags < 0 || set < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adds one to an eventfd (a full counter means a wake-up is pending anyway).
pub(crate) fn poke(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writing 8 bytes from a live u64.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Empties an eventfd.
pub(crate) fn drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a live u64; non-blocking.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}
