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

use std::net::SocketAddr;

use crate::control::Control;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::join::try_join2;
use crate::node::Node;

/// How long [`Mesh::join`] keeps trying to reach a member that is not listening yet.
pub const JOIN_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

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
            for _ in rank..size {
                let ep = node.accept().await?;
                let (r, s) = ep.recv_hello().await?;
                let r = r as usize;
                if s as usize != size || r < rank || by_rank[r].is_some() {
                    return Err(Error::Malformed(format!(
                        "mesh: a peer said it is rank {r} of {s}; expected a rank in {rank}..{size} \
                         of {size}, each once"
                    )));
                }
                by_rank[r] = Some(ep);
            }
            Ok::<_, Error>(by_rank)
        };
        let (mut out, mut accepted) = try_join2(connects, accepts).await?;
        let self_in = accepted[rank].take().expect("accepted from itself");
        for slot in accepted.iter_mut().skip(rank + 1) {
            out.push(slot.take().expect("accepted from every higher rank"));
        }
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
