//! An endpoint leaves nothing behind once it is dropped: its completion-routing tasks (which
//! hold its completion queues and operation table) end, whether or not work was outstanding
//! when it went. A routing task left waiting on an empty queue kept about 8 KiB per connection
//! for the life of the core (found by barewire-soak's flat-memory check).

use std::rc::Rc;
use std::time::Duration;

use barewire_drivers::{
    connect, Access, Buffer, Device, DriverConfig, Endpoint, Listener, RegionDescriptor, Remote,
};
use barewire_engine::{spawn_local, time};
use barewire_test_support::rt;

fn soft() -> Device {
    Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap()
}

async fn connected(
    dev: &Device,
    pd: &barewire_drivers::ProtectionDomain,
    addr: std::net::SocketAddr,
) -> Endpoint {
    let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let (qp, _) = connect(addr, pd, &scq, &rcq, &dev.connect_options())
        .await
        .unwrap();
    Endpoint::new(qp, scq, rcq)
}

/// Waits (up to a second) for `probe` to stop upgrading.
async fn released(probe: &std::rc::Weak<()>) -> bool {
    for _ in 0..100 {
        if probe.upgrade().is_none() {
            return true;
        }
        time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[test]
fn a_dropped_endpoint_ends_its_routing_tasks() {
    rt().block_on(async {
        let dev = Rc::new(soft());
        let pd = Rc::new(dev.alloc_pd().unwrap());
        let l = Listener::bind(&dev, ([127, 0, 0, 1], 0).into(), &dev.connect_options()).unwrap();
        let addr = ([127, 0, 0, 1], l.port()).into();
        let (sdev, spd) = (dev.clone(), pd.clone());
        // The server hangs up on each connection at once.
        let server = spawn_local(async move {
            loop {
                let (scq, rcq) = (sdev.create_cq(64).unwrap(), sdev.create_cq(64).unwrap());
                if let Ok((qp, _)) = l.accept(&spd, &scq, &rcq).await {
                    drop(Endpoint::new(qp, scq, rcq));
                }
            }
        });
        let region = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE).unwrap();

        // Idle, dropped after the peer hung up: nothing was ever posted, the connection is
        // already down, so no completion will ever come to wake its tasks.
        let ep = connected(&dev, &pd, addr).await;
        let probe = ep.routing_probe();
        time::sleep(Duration::from_millis(100)).await;
        assert!(
            probe.upgrade().is_some(),
            "routing while the endpoint lives"
        );
        drop(ep);
        assert!(
            released(&probe).await,
            "an idle endpoint's routing tasks outlived it"
        );

        // Outstanding: a READ of a key the peer never gave fails (or is flushed) after the
        // drop, and the tasks end once that last completion is routed.
        let ep = connected(&dev, &pd, addr).await;
        let probe = ep.routing_probe();
        let nowhere = RegionDescriptor {
            rkey: barewire_drivers::Stag(0x1234_5678),
            addr: 0,
            len: 4096,
        };
        let read = ep.read(&region, 0, 64, Remote::at(nowhere, 0));
        drop(ep);
        let _ = read.await;
        assert!(
            released(&probe).await,
            "routing tasks outlived their last completion"
        );
        server.cancel();
    });
}
