//! UDP on the engine (run under both reactors by scripts/test.sh): datagrams both ways with
//! their senders, truncation to the buffer, and a cancelled receive that leaves the socket
//! usable.

use std::time::Duration;

use barewire_engine::net::UdpSocket;
use barewire_engine::{time, Runtime};

fn rt() -> Runtime {
    Runtime::builder().cores(1).sleeping().build().unwrap()
}

#[test]
fn datagrams_go_both_ways_with_their_senders() {
    rt().block_on(async {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        for i in 0..1000u32 {
            let (r, _) = a.send_to(i.to_le_bytes().to_vec(), ba).await;
            assert_eq!(r.unwrap(), 4);
            let (r, buf) = b.recv_from(Vec::with_capacity(16)).await;
            let (n, from) = r.unwrap();
            assert_eq!((n, from), (4, aa));
            assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), i);
            let (r, _) = b.send_to(buf, aa).await;
            assert_eq!(r.unwrap(), 4);
            let (r, buf) = a.recv_from(vec![0u8; 16]).await;
            assert_eq!(r.unwrap(), (4, ba));
            assert_eq!(&buf[..4], &i.to_le_bytes());
        }
    });
}

#[test]
fn a_long_datagram_is_cut_to_the_buffer() {
    rt().block_on(async {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let (r, _) = a.send_to(vec![7u8; 1000], b.local_addr().unwrap()).await;
        assert_eq!(r.unwrap(), 1000);
        let (r, buf) = b.recv_from(Vec::with_capacity(100)).await;
        assert_eq!(r.unwrap().0, 100);
        assert_eq!(buf.len(), 100);
        assert!(buf.iter().all(|x| *x == 7));
    });
}

#[test]
fn a_cancelled_receive_leaves_the_socket_usable() {
    rt().block_on(async {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        // Nothing arrives: the receive is dropped by the timeout while in flight.
        assert!(
            time::timeout(Duration::from_millis(20), b.recv_from(vec![0u8; 64]))
                .await
                .is_err()
        );
        let (r, _) = a.send_to(b"after".to_vec(), b.local_addr().unwrap()).await;
        r.unwrap();
        let (r, buf) = b.recv_from(vec![0u8; 64]).await;
        let (n, _) = r.unwrap();
        assert_eq!(&buf[..n], b"after");
    });
}

#[test]
fn a_waiting_receive_uses_a_registered_slot_that_the_socket_gives_back() {
    rt().block_on(async {
        let in_use = || barewire_engine::stats().registered_files;
        let before = in_use();
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let to = b.local_addr().unwrap();
        let sender = barewire_engine::spawn_local(async move {
            time::sleep(Duration::from_millis(20)).await;
            a.send_to(b"late".to_vec(), to).await.0.unwrap();
        });
        // Nothing is there yet: the receive waits in the ring (on io_uring), naming b's slot.
        let (r, buf) = b.recv_from(vec![0u8; 16]).await;
        assert_eq!(r.unwrap().0, 4);
        assert_eq!(&buf[..4], b"late");
        sender.await.unwrap();
        let uring = matches!(
            barewire_engine::reactor(),
            barewire_engine::ReactorKind::IoUring(_)
        );
        assert_eq!(in_use(), before + uring as u64);
        drop(b);
        assert_eq!(in_use(), before, "the slot is given back");
    });
}
