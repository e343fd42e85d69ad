//! Typed one-sided operations between two nodes (two cores, each with its own endpoint):
//! the owner registers a `Region<Account>` and a `Region<u64>` of counters and sends their
//! descriptors; the other side reads, writes and updates them without the owner's CPU taking
//! part, and the owner then sees the results in its own memory.
//!
//!     cargo run --release --example typed_ops

use std::time::Duration;

use barewire::engine::Runtime;
use barewire::{Align, Node};

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Account {
    id: u64,
    balance: i64,
}

fn rt() -> Runtime {
    Runtime::builder()
        .cores(1)
        .pin(false)
        .idle_spin(Duration::from_micros(50))
        .build()
        .expect("runtime")
}

fn main() -> barewire::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let owner = std::thread::spawn(move || -> barewire::Result<()> {
        rt().block_on(async move {
            let node = Node::new()?;
            tx.send(node.listen("127.0.0.1:0".parse().unwrap())?)
                .unwrap();
            let ep = node.accept().await?;
            let accounts = node.region::<Account>(4, Align::CacheLine)?;
            for i in 0..4 {
                accounts.set(
                    i,
                    Account {
                        id: 100 + i as u64,
                        balance: 50,
                    },
                );
            }
            let counters = node.region::<u64>(2, Align::CacheLine)?;
            ep.send_region(&accounts).await?;
            ep.send_region(&counters).await?;
            let (_t, done) = ep.open_channel::<u8>(Default::default()).await?;
            done.recv().await?;
            // Stay connected while the other side's flush completes.
            barewire::engine::time::sleep(Duration::from_millis(100)).await;
            println!("owner sees: {:?}", accounts.to_vec());
            println!("owner sees counters: {:?}", counters.to_vec());
            Ok(())
        })
    });
    let port = rx.recv().unwrap();
    rt().block_on(async move {
        let node = Node::new()?;
        println!(
            "driver: {} ({})",
            node.device().name(),
            node.device().transport()
        );
        let ep = node
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await?;
        let accounts = ep.recv_region::<Account>().await?;
        let counters = ep.recv_region::<u64>().await?;
        println!("got {accounts:?}\n    {counters:?}");
        let mut a = ep.read(&accounts, 2).await?;
        println!("read accounts[2] = {a:?}");
        a.balance += 25;
        ep.write(&accounts, 2, a).await?;
        let all = ep.read_slice(&accounts, 0, 4).await?;
        println!("read all four: {all:?}");
        let old = ep.fetch_add(&counters, 0, 10).await?;
        println!("fetch_add(counters[0], 10) returned {old}");
        let old = ep.compare_and_swap(&counters, 1, 0, 7).await?;
        println!(
            "compare_and_swap(counters[1], 0 -> 7) returned {old} (swapped: {})",
            old == 0
        );
        let (done, _r) = ep.open_channel::<u8>(Default::default()).await?;
        done.send(&1).await?;
        done.flush().await?;
        Ok::<_, barewire::Error>(())
    })?;
    owner.join().unwrap()
}
