//! Receives posted as part of connection setup are in place before the peer can send: a peer
//! that sends the moment it is connected is received, where a receive posted after the
//! accepting task first yields would be too late (iWARP answers a Send with no receive posted
//! with a Terminate).

use barewire_test_support::rt;
use std::time::Duration;

use barewire_drivers::{
    connect, Access, Buffer, ConnectOptions, Device, DriverConfig, Listener, RecvWr, SendOp,
    SendWr, WcStatus,
};
use barewire_engine::time;

fn soft() -> Device {
    Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap()
}

#[test]
fn a_send_right_after_connect_finds_the_initial_receives() {
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        rt().block_on(async move {
            let dev = soft();
            let pd = dev.alloc_pd().unwrap();
            let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
            let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
            let l =
                Listener::bind(&dev, ([127, 0, 0, 1], 0).into(), &dev.connect_options()).unwrap();
            tx.send(l.port()).unwrap();
            let recvs = vec![RecvWr {
                wr_id: 5,
                sges: [buf.sge(0, 4096)].into(),
            }];
            let (_qp, _) = l.accept_with_recvs(&pd, &scq, &rcq, recvs).await.unwrap();
            // Yield for a while before doing anything: the client's Send arrives meanwhile.
            time::sleep(Duration::from_millis(50)).await;
            let wc = rcq.next().await;
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (5, WcStatus::Success, 11)
            );
            let mut got = [0u8; 11];
            buf.read_at(0, &mut got);
            assert_eq!(&got, b"hello early");
        })
    });
    let port: u16 = rx.recv().unwrap();
    rt().block_on(async move {
        let dev = soft();
        let pd = dev.alloc_pd().unwrap();
        let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
        let buf = Buffer::new(&pd, 64, 64, Access::LOCAL_WRITE).unwrap();
        buf.write_at(0, b"hello early");
        let opts = ConnectOptions::default();
        let (qp, _) = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts)
            .await
            .unwrap();
        qp.post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sges: [buf.sge(0, 11)].into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
        assert_eq!(scq.next().await.status, WcStatus::Success);
        time::sleep(Duration::from_millis(100)).await;
    });
    server.join().unwrap();
}
