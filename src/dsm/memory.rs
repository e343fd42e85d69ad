//! `SharedMemory<T>`: one shared object per node.

use bytemuck::Pod;

use super::{SharedArray, SharedOptions};
use crate::error::Result;
use crate::mesh::Mesh;
use crate::node::Node;

/// One `T` on each member of a [`Mesh`], each readable, writable and updatable from every
/// member, linearizably (the protocol is [the module's](crate::dsm)). The seed's
/// `createSharedMemory nodes initialValue`.
///
/// ```no_run
/// # async fn demo(node: &barewire::Node, mesh: &barewire::Mesh) -> barewire::Result<()> {
/// use barewire::dsm::{SharedMemory, SharedOptions};
/// let counters = SharedMemory::<u64>::create(node, mesh, 0, SharedOptions::default()).await?;
/// counters.fetch_add(1, 10).await?;            // node 1's counter += 10
/// counters.update(2, |v| (*v).max(7)).await?;  // read-modify-write on node 2's
/// counters.write_to(0, 99).await?;
/// assert_eq!(counters.read_from(0).await?, 99);
/// # Ok(()) }
/// ```
pub struct SharedMemory<T: Pod> {
    array: SharedArray<T>,
}

impl<T: Pod> SharedMemory<T> {
    /// Creates one object per member of `mesh`, each holding `initial` (collective: every
    /// member calls it, in the same order as its other shared objects).
    pub async fn create(
        node: &Node,
        mesh: &Mesh,
        initial: T,
        opts: SharedOptions,
    ) -> Result<SharedMemory<T>> {
        Ok(SharedMemory {
            array: SharedArray::create(node, mesh, mesh.size() as u64, initial, opts).await?,
        })
    }

    /// Nodes (one object each).
    pub fn nodes(&self) -> usize {
        self.array.len() as usize
    }

    /// The object on `node`: one RDMA READ when nobody is committing to it.
    pub async fn read_from(&self, node: usize) -> Result<T> {
        self.array.get(node as u64).await
    }

    /// Sets the object on `node`.
    pub async fn write_to(&self, node: usize, v: T) -> Result<()> {
        self.array.put(node as u64, v).await
    }

    /// Replaces the object on `node` by `f(old)` atomically (no concurrent update is lost);
    /// returns the new value. `f` may run more than once and must not have side effects.
    pub async fn update(&self, node: usize, f: impl FnMut(&T) -> T) -> Result<T> {
        self.array.update(node as u64, f).await
    }

    /// Leases this node has broken so far.
    pub fn lease_breaks(&self) -> u64 {
        self.array.lease_breaks()
    }
}

impl SharedMemory<u64> {
    /// Atomically adds `add` to the counter on `node`; returns the old value.
    pub async fn fetch_add(&self, node: usize, add: u64) -> Result<u64> {
        self.array.fetch_add(node as u64, add).await
    }

    /// Atomically replaces the value on `node` by `new` if it holds `expected`; returns the old
    /// value.
    pub async fn compare_and_swap(&self, node: usize, expected: u64, new: u64) -> Result<u64> {
        self.array
            .compare_and_swap(node as u64, expected, new)
            .await
    }
}
