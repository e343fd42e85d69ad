//! barewire-node: a small peer process for tests and demonstrations of the typed API.
//!
//! ```text
//! barewire-node echo         listen on 127.0.0.1 (port printed as `READY <port>`), accept
//!                            one endpoint, open a `u64` channel, answer each n with n + 1
//! barewire-node send ADDR    connect to ADDR, open a `u64` channel, send 0, 1, 2, ... one
//!                            per millisecond, forever
//! ```
//!
//! The driver comes from `BAREWIRE_DRIVER` (the software provider when unset and there is no
//! RDMA hardware).

use std::io::Write;
use std::time::Duration;

use barewire::{Node, Result};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = barewire::engine::Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .expect("runtime");
    let r: Result<()> = rt.block_on(async move {
        let node = Node::new()?;
        match (args.first().map(String::as_str), args.get(1)) {
            (Some("echo"), _) => {
                let port = node.listen("127.0.0.1:0".parse().unwrap())?;
                println!("READY {port}");
                let _ = std::io::stdout().flush();
                let ep = node.accept().await?;
                let (tx, rx) = ep.open_channel::<u64>(Default::default()).await?;
                loop {
                    let n = rx.recv().await?;
                    tx.send(&(n + 1)).await?;
                }
            }
            (Some("send"), Some(addr)) => {
                let addr = addr
                    .parse()
                    .map_err(|e| barewire::Error::Invalid(format!("{addr}: {e}")))?;
                let ep = node.connect(addr).await?;
                let (tx, _rx) = ep.open_channel::<u64>(Default::default()).await?;
                for n in 0.. {
                    tx.send(&n).await?;
                    barewire::engine::time::sleep(Duration::from_millis(1)).await;
                }
                Ok(())
            }
            _ => Err(barewire::Error::Invalid(
                "usage: barewire-node echo | barewire-node send ADDR".into(),
            )),
        }
    });
    if let Err(e) = r {
        eprintln!("barewire-node: {e}");
        std::process::exit(1);
    }
}
