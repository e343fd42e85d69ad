//! A full mesh: one endpoint from this node to every node of a group, itself included, indexed
//! by rank. What collective structures (distributed shared memory, and later actors and the
//! cluster layer) are built over.
//!
//! Rank `i` connects to every rank `j < i` and to itself, and accepts one connection from
//! every rank `j > i` and one from itself; the first word on each connection is a `Hello`
//! naming the connecting rank, so accepts may complete in any order. The connection to itself
//! is a real connection through the same driver: a node reaches its own memory through the same
//! one-sided operations as everyone else's, so a protocol built on the mesh has no special
//! local path that could bypass it.

use std::future::Future;
use std::net::SocketAddr;

use crate::control::Control;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::join::try_join2;
use crate::node::Node;

/// How long [`Mesh::join`] keeps trying to reach a member that is not listening yet.
pub const JOIN_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long an accepted connection has to say which rank it is before it is dropped.
pub const HELLO_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Connections from this node to every rank of a group (itself included), by rank.
///
/// Every member calls [`Mesh::join`] with the same address list; member `rank` must already be
/// listening on `addrs[rank]`.
///
/// ```no_run
/// # async fn demo(rank: usize) -> barewire::Result<()> {
/// use barewire::{Mesh, Node};
/// let addrs: Vec<std::net::SocketAddr> =
///     ["127.0.0.1:7600", "127.0.0.1:7601", "127.0.0.1:7602"].iter().map(|a| a.parse().unwrap()).collect();
/// let node = Node::new()?;
/// node.listen(addrs[rank])?;
/// let mesh = Mesh::join(&node, rank, &addrs).await?;
/// assert_eq!(mesh.size(), 3);
/// let to_next = mesh.endpoint((rank + 1) % 3);
/// # let _ = to_next; Ok(()) }
/// ```
///
/// Cloning gives another handle to the same connections.
#[derive(Clone)]
pub struct Mesh {
    rank: usize,
    /// `out[j]`: the endpoint whose operations reach rank `j`.
    out: Vec<Endpoint>,
    /// The accepting end of the connection to itself: what this node's own requests arrive on.
    self_in: Endpoint,
}

impl Mesh {
    /// Connects this node (rank `rank`, listening on `addrs[rank]`) to every member of the
    /// group. Returns once every connection is up and has said which rank it is. Members may
    /// start in any order: one that does not listen yet is tried again for up to
    /// [`JOIN_WAIT`].
    pub async fn join(node: &Node, rank: usize, addrs: &[SocketAddr]) -> Result<Mesh> {
        let size = addrs.len();
        if rank >= size {
            return Err(Error::Invalid(format!(
                "rank {rank} of a mesh of {size} members"
            )));
        }
        let connects = async {
            let mut out = Vec::with_capacity(rank + 1);
            for (j, addr) in addrs.iter().enumerate().take(rank + 1) {
                // Members start when their launcher gets to them: one that is not listening yet
                // is tried again, for up to JOIN_WAIT.
                let t0 = std::time::Instant::now();
                let mut pause = std::time::Duration::from_millis(5);
                let ep = loop {
                    match node.connect(*addr).await {
                        Ok(ep) => break ep,
                        Err(e) if t0.elapsed() < JOIN_WAIT => {
                            let _ = e;
                            barewire_engine::time::sleep(pause).await;
                            pause = (pause * 2).min(std::time::Duration::from_millis(200));
                        }
                        Err(e) => {
                            return Err(Error::Invalid(format!(
                            "mesh: connecting to rank {j} at {addr} (tried for {JOIN_WAIT:?}): {e}"
                        )))
                        }
                    }
                };
                ep.send_hello(rank as u32, size as u32).await?;
                out.push(ep);
            }
            Ok::<_, Error>(out)
        };
        let accepts = async {
            let mut by_rank: Vec<Option<Endpoint>> = (0..size).map(|_| None).collect();
            let mut need = size - rank;
            // Hellos are read concurrently, each with a deadline: a connection that never says
            // which rank it is, or names one that is not expected (a stranger, a port scanner,
            // a duplicate), is dropped and the join goes on without it.
            type Said = (Endpoint, Result<(u32, u32)>);
            let mut hellos: Vec<std::pin::Pin<Box<dyn Future<Output = Said>>>> = Vec::new();
            let mut accept = Box::pin(node.accept());
            std::future::poll_fn(|cx| {
                while let std::task::Poll::Ready(r) = accept.as_mut().poll(cx) {
                    let ep = r?;
                    hellos.push(Box::pin(async move {
                        let said = match barewire_engine::time::timeout(HELLO_WAIT, ep.recv_hello())
                            .await
                        {
                            Ok(r) => r,
                            Err(_) => {
                                Err(Error::Timeout(format!("no hello within {HELLO_WAIT:?}")))
                            }
                        };
                        (ep, said)
                    }));
                    accept.set(node.accept());
                }
                let mut i = 0;
                while i < hellos.len() {
                    let std::task::Poll::Ready((ep, said)) = hellos[i].as_mut().poll(cx) else {
                        i += 1;
                        continue;
                    };
                    drop(hellos.swap_remove(i));
                    match said {
                        Ok((r, s))
                            if s as usize == size
                                && (rank..size).contains(&(r as usize))
                                && by_rank[r as usize].is_none() =>
                        {
                            by_rank[r as usize] = Some(ep);
                            need -= 1;
                            if need == 0 {
                                return std::task::Poll::Ready(Ok::<_, Error>(std::mem::take(
                                    &mut by_rank,
                                )));
                            }
                        }
                        // Not a member, or not one expected here: dropped (closing it).
                        _ => drop(ep),
                    }
                }
                std::task::Poll::Pending
            })
            .await
        };
        let (mut out, mut accepted) = try_join2(connects, accepts).await?;
        let self_in = accepted[rank].take().expect("accepted from itself");
        for slot in accepted.iter_mut().skip(rank + 1) {
            out.push(slot.take().expect("accepted from every higher rank"));
        }
        // This node uses its connection to itself through the connecting end, so what it
        // sends itself there must be served at the accepting end.
        *out[rank].inner().serves_windows.borrow_mut() = Some(self_in.inner().clone());
        Ok(Mesh { rank, out, self_in })
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Members, this one included.
    pub fn size(&self) -> usize {
        self.out.len()
    }

    /// The endpoint whose operations reach rank `j` (for `j == rank()`, this node's own memory
    /// through its connection to itself).
    ///
    /// # Panics
    /// If `j` is not a rank of the mesh.
    pub fn endpoint(&self, j: usize) -> &Endpoint {
        &self.out[j]
    }

    /// The endpoint on which rank `j`'s messages to this node arrive: the same connection as
    /// [`endpoint`](Self::endpoint) for another rank, the accepting end for this node itself.
    pub(crate) fn inbound_from(&self, j: usize) -> &Endpoint {
        if j == self.rank {
            &self.self_in
        } else {
            &self.out[j]
        }
    }
}

impl Endpoint {
    pub(crate) async fn send_hello(&self, rank: u32, size: u32) -> Result<()> {
        self.inner()
            .send_control(&Control::Hello { rank, size })
            .await
    }

    pub(crate) async fn recv_hello(&self) -> Result<(u32, u32)> {
        self.inner()
            .wait_control(|_, c| match c {
                Control::Hello { rank, size } => Some((*rank, *size)),
                _ => None,
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use barewire_engine::time::{sleep, timeout};
    use barewire_engine::{spawn_local, Runtime};

    use super::*;

    /// A stranger that completes the connection and then says nothing, and one that names a
    /// rank the group does not have, reach the listener before the real member (the node
    /// itself): the join completes at once anyway, without waiting for their deadline.
    #[test]
    fn strangers_that_say_nothing_or_lie_do_not_stop_a_join() {
        let rt = Runtime::builder().cores(1).sleeping().build().unwrap();
        rt.block_on(async {
            let node = Node::soft().unwrap();
            let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let silent = spawn_local(async move {
                let n = Node::soft().unwrap();
                let ep = n.connect(addr).await;
                sleep(Duration::from_secs(5)).await;
                drop((ep, n));
            });
            let liar = spawn_local(async move {
                let n = Node::soft().unwrap();
                if let Ok(ep) = n.connect(addr).await {
                    let _ = ep.send_hello(5, 7).await;
                    sleep(Duration::from_secs(5)).await;
                }
                drop(n);
            });
            // Their MPA Requests arrive first.
            sleep(Duration::from_millis(50)).await;
            let t0 = Instant::now();
            let mesh = timeout(Duration::from_secs(10), Mesh::join(&node, 0, &[addr]))
                .await
                .expect("the join finished within 10 s")
                .expect("the join succeeded");
            assert_eq!(mesh.size(), 1);
            assert!(
                t0.elapsed() < HELLO_WAIT,
                "the join waited {:?} for strangers",
                t0.elapsed()
            );
            silent.cancel();
            liar.cancel();
        });
    }
}
