//! TCP and UDP with owned-buffer I/O. Both types set `TCP_NODELAY` by default: this is a latency engine,
//! and Nagle's algorithm would hold back small messages for up to 40 ms.

pub(crate) mod addr;
mod tcp_listener;
mod tcp_stream;
mod udp;

pub use tcp_listener::{Incoming, TcpListener};
pub(crate) use tcp_stream::getsockopt_int;
pub use tcp_stream::{check_keepalive, TcpStream};
pub use udp::UdpSocket;
