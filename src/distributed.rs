//! `DistributedChannel<T>`: one channel to each of N endpoints, with fan-out and gather.

use crate::channel::{ChannelOptions, Codec, Raw, Receiver, Sender};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use bytemuck::Pod;

/// Channels to N peers: send to one node, spread items round-robin, broadcast, gather.
///
/// ```no_run
/// # async fn demo(peers: Vec<barewire::Endpoint>) -> barewire::Result<()> {
/// use barewire::DistributedChannel;
/// let dc = DistributedChannel::<u64>::open(&peers, Default::default()).await?;
/// dc.distribute(&[1, 2, 3, 4, 5]).await?;   // node 0 gets 1 and 4, node 1 gets 2 and 5, ...
/// dc.broadcast(&42).await?;
/// let answers: Vec<u64> = dc.gather().await?; // one from each node, in node order
/// # let _ = answers; Ok(()) }
/// ```
pub struct DistributedChannel<T, C: Codec<T> = Raw> {
    tx: Vec<Sender<T, C>>,
    rx: Vec<Receiver<T, C>>,
    next: std::cell::Cell<usize>,
}

impl<T: Pod> DistributedChannel<T, Raw> {
    /// Opens a channel with each endpoint (each peer opens one with us, as for
    /// [`Endpoint::open_channel`]).
    pub async fn open(peers: &[Endpoint], opts: ChannelOptions) -> Result<Self> {
        let mut tx = Vec::with_capacity(peers.len());
        let mut rx = Vec::with_capacity(peers.len());
        for p in peers {
            let (t, r) = p.open_channel::<T>(opts).await?;
            tx.push(t);
            rx.push(r);
        }
        Ok(DistributedChannel {
            tx,
            rx,
            next: std::cell::Cell::new(0),
        })
    }
}

impl<T, C: Codec<T>> DistributedChannel<T, C> {
    /// Nodes.
    pub fn len(&self) -> usize {
        self.tx.len()
    }

    /// True with no nodes.
    pub fn is_empty(&self) -> bool {
        self.tx.is_empty()
    }

    fn node(&self, i: usize) -> Result<&Sender<T, C>> {
        self.tx.get(i).ok_or_else(|| {
            Error::Invalid(format!("node {i} of a channel to {} nodes", self.tx.len()))
        })
    }

    /// Sends `item` to node `i`.
    pub async fn write_to_node(&self, i: usize, item: &T) -> Result<()> {
        self.node(i)?.send(item).await
    }

    /// Spreads `items` over the nodes round-robin, continuing where the last call stopped.
    pub async fn distribute(&self, items: &[T]) -> Result<()> {
        if self.tx.is_empty() {
            return Err(Error::Invalid("distribute over no nodes".into()));
        }
        for item in items {
            let i = self.next.get();
            self.next.set((i + 1) % self.tx.len());
            self.tx[i].send(item).await?;
        }
        Ok(())
    }

    /// Sends `item` to every node.
    pub async fn broadcast(&self, item: &T) -> Result<()> {
        for t in &self.tx {
            t.send(item).await?;
        }
        Ok(())
    }

    /// Receives one message from each node, in node order.
    pub async fn gather(&self) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(self.rx.len());
        for r in &self.rx {
            out.push(r.recv().await?);
        }
        Ok(out)
    }

    /// Receives the next message from node `i`.
    pub async fn recv_from(&self, i: usize) -> Result<T> {
        self.rx
            .get(i)
            .ok_or_else(|| Error::Invalid(format!("node {i} of {}", self.rx.len())))?
            .recv()
            .await
    }

    /// Waits until everything sent has been placed at every node.
    pub async fn flush(&self) -> Result<()> {
        for t in &self.tx {
            t.flush().await?;
        }
        Ok(())
    }
}
