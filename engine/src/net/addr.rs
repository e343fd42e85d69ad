//! `SocketAddr` <-> `sockaddr_storage`.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A sockaddr the kernel can read or fill, kept at a stable heap address by its owner.
#[repr(C)]
pub(crate) struct RawAddr {
    pub(crate) storage: libc::sockaddr_storage,
    pub(crate) len: libc::socklen_t,
}

impl RawAddr {
    pub(crate) fn empty() -> Box<RawAddr> {
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid (unspecified) value.
        let storage = unsafe { mem::zeroed() };
        Box::new(RawAddr {
            storage,
            len: mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
        })
    }

    pub(crate) fn from_addr(addr: &SocketAddr) -> Box<RawAddr> {
        let mut raw = RawAddr::empty();
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe {
                    std::ptr::write(&mut raw.storage as *mut _ as *mut libc::sockaddr_in, sin)
                };
                raw.len = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe {
                    std::ptr::write(&mut raw.storage as *mut _ as *mut libc::sockaddr_in6, sin6)
                };
                raw.len = mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            }
        }
        raw
    }

    pub(crate) fn as_ptr(&self) -> *const libc::sockaddr {
        &self.storage as *const _ as *const libc::sockaddr
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        &mut self.storage as *mut _ as *mut libc::sockaddr
    }

    pub(crate) fn to_addr(&self) -> io::Result<SocketAddr> {
        match self.storage.ss_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let sin = unsafe { &*(&self.storage as *const _ as *const libc::sockaddr_in) };
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Ok(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let sin6 = unsafe { &*(&self.storage as *const _ as *const libc::sockaddr_in6) };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Ok(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )))
            }
            f => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unsupported address family {f}"),
            )),
        }
    }
}

/// `getsockname` / `getpeername`.
pub(crate) fn socket_addr(fd: std::os::fd::RawFd, peer: bool) -> io::Result<SocketAddr> {
    let mut raw = RawAddr::empty();
    let mut len = raw.len;
    // SAFETY: raw is a valid sockaddr_storage buffer of `len` bytes.
    let rc = unsafe {
        if peer {
            libc::getpeername(fd, raw.as_mut_ptr(), &mut len)
        } else {
            libc::getsockname(fd, raw.as_mut_ptr(), &mut len)
        }
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    raw.to_addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for a in ["127.0.0.1:8080", "[::1]:9999", "10.1.2.3:1"] {
            let addr: SocketAddr = a.parse().unwrap();
            assert_eq!(RawAddr::from_addr(&addr).to_addr().unwrap(), addr);
        }
    }
}
