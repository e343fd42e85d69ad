//! TCP and UDP with owned-buffer I/O. Both types set `TCP_NODELAY` by default: this is a latency engine,
//! and Nagle's algorithm would hold back small messages for up to 40 ms.
//!
//! Also what every listener shares, whatever it carries: which accept errors are passing
//! ([`accept_error_is_transient`]), handshakes and open connections capped in all and per
//! source ([`Handshakes`], [`Connections`]), and bans for sources that break protection rules
//! ([`Strikes`]).

pub(crate) mod addr;
mod connections;
mod handshakes;
mod strikes;
mod tcp_listener;
mod tcp_stream;
mod udp;

pub use connections::{Admitted, Connections};
pub use handshakes::Handshakes;
pub use strikes::Strikes;
pub use tcp_listener::{accept_error_is_transient, Incoming, TcpListener};
pub(crate) use tcp_stream::getsockopt_int;
pub use tcp_stream::{check_keepalive, TcpStream};
pub use udp::UdpSocket;
