//! A node: this core's device and protection domain, the regions it registers, and the
//! endpoints it accepts or connects.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use barewire_drivers::{Device, DriverConfig, Listener, ProtectionDomain};
use bytemuck::Pod;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::region::{Align, Region};

/// One per core: opens the device `BAREWIRE_DRIVER` selects (the software provider where there
/// is no RDMA hardware), registers typed regions, listens, accepts and connects.
///
/// ```no_run
/// # async fn demo() -> barewire::Result<()> {
/// use barewire::{Align, Node};
/// let node = Node::new()?;
/// let port = node.listen("127.0.0.1:0".parse().unwrap())?;
/// let ep = node.accept().await?;
/// let table = node.region::<u64>(1024, Align::Page)?;
/// ep.send_region(&table).await?;
/// # let _ = port; Ok(()) }
/// ```
pub struct Node {
    dev: Rc<Device>,
    pd: Rc<ProtectionDomain>,
    listener: RefCell<Option<Listener>>,
}

impl Node {
    /// Opens what `BAREWIRE_DRIVER` / `BAREWIRE_DEVICE` select (`auto` when unset).
    pub fn new() -> Result<Node> {
        Node::with_config(&DriverConfig::from_env()?)
    }

    /// Uses barewire's software provider whatever the environment says.
    pub fn soft() -> Result<Node> {
        Node::with_config(&DriverConfig::parse("soft", None)?)
    }

    /// Opens the device `cfg` selects.
    pub fn with_config(cfg: &DriverConfig) -> Result<Node> {
        if !barewire_engine::in_runtime() {
            return Err(Error::Invalid(
                "a Node belongs to a core: create it inside Runtime::block_on or a task".into(),
            ));
        }
        crate::channel::ensure_flusher();
        let dev = Device::open(cfg)?;
        let pd = dev.alloc_pd()?;
        Ok(Node {
            dev: Rc::new(dev),
            pd: Rc::new(pd),
            listener: RefCell::new(None),
        })
    }

    /// The device in use (its name and transport).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Registers a zeroed region of `len` `T`s, aligned as asked.
    pub fn region<T: Pod>(&self, len: usize, align: Align) -> Result<Region<T>> {
        Region::new(&self.pd, len, align)
    }

    /// Listens on `addr`; returns the port (useful with port 0). A node listens on one address
    /// at a time: listening again closes the previous listener (the connections it accepted
    /// stay). An `accept` already waiting keeps the previous listener until it completes or is
    /// dropped; the next `accept` uses the new one.
    pub fn listen(&self, addr: SocketAddr) -> Result<u16> {
        let l = Listener::bind(&self.dev, addr, &self.options())?;
        let port = l.port();
        *self.listener.borrow_mut() = Some(l);
        Ok(port)
    }

    /// How deep each connection's completion queues are, and its queue pair's send and
    /// receive queues: the transport's queue depth (at least 64) times 16. The queues must be
    /// as deep as the completion queues, not the transport's depth alone: where a channel's
    /// receiver learns of each run by immediate data (verbs), it keeps a receive posted for
    /// every message its peer may have in flight (a ring's capacity, 256 by default, plus a
    /// few), and a sender keeps up to a quarter of a ring's runs unsignaled in its send queue.
    fn depth(&self) -> usize {
        self.dev.defaults().queue_depth.max(64) as usize * 16
    }

    /// The options of this node's connections (see `depth`).
    fn options(&self) -> barewire_drivers::ConnectOptions {
        barewire_drivers::ConnectOptions {
            depth: self.depth() as u32,
            ..self.dev.connect_options()
        }
    }

    fn endpoint_parts(
        &self,
    ) -> Result<(
        barewire_drivers::CompletionQueue,
        barewire_drivers::CompletionQueue,
    )> {
        let depth = self.depth();
        Ok((self.dev.create_cq(depth)?, self.dev.create_cq(depth)?))
    }

    /// Accepts the next peer. Cancel-safe: dropping the future before it completes leaves the
    /// node listening.
    pub async fn accept(&self) -> Result<Endpoint> {
        let (scq, rcq) = self.endpoint_parts()?;
        let l = self.listener.borrow_mut().take().ok_or_else(|| {
            Error::Invalid("accept before listen (or from two tasks at once)".into())
        })?;
        // Puts the listener back however this future ends, unless `listen` put a new one there
        // meanwhile (the latest `listen` wins; this one closes).
        struct Back<'a>(&'a RefCell<Option<Listener>>, Option<Listener>);
        impl Drop for Back<'_> {
            fn drop(&mut self) {
                let mut slot = self.0.borrow_mut();
                if slot.is_none() {
                    *slot = self.1.take();
                }
            }
        }
        let back = Back(&self.listener, Some(l));
        let (recv, wrs) = Endpoint::initial_recvs(&self.pd)?;
        let l = back.1.as_ref().expect("held until dropped");
        let r = l.accept_with_recvs(&self.pd, &scq, &rcq, wrs).await;
        drop(back);
        let (qp, _) = r?;
        Endpoint::new(qp, scq, rcq, self.pd.clone(), true, recv)
    }

    /// Connects to a listening node.
    pub async fn connect(&self, addr: SocketAddr) -> Result<Endpoint> {
        let (scq, rcq) = self.endpoint_parts()?;
        let (recv, wrs) = Endpoint::initial_recvs(&self.pd)?;
        let opts = barewire_drivers::ConnectOptions {
            initial_recvs: wrs,
            ..self.options()
        };
        let (qp, _) = barewire_drivers::connect(addr, &self.pd, &scq, &rcq, &opts).await?;
        Endpoint::new(qp, scq, rcq, self.pd.clone(), false, recv)
    }

    /// Two nodes on this core, made with `cfg` and connected over loopback, as a socket pair
    /// is: for tests, and for trying out code that talks to a peer. Returns the nodes (keep
    /// them while the endpoints are in use) and the accepting node's endpoint, then the
    /// connecting node's.
    ///
    /// ```
    /// # use barewire::{drivers::DriverConfig, engine::Runtime, ChannelOptions, Node};
    /// Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
    ///     let cfg = DriverConfig::parse("soft", None).unwrap();
    ///     let (_nodes, a, b) = Node::loopback_pair(&cfg).await.unwrap();
    ///     let opts = ChannelOptions::new(16, 8);
    ///     let at_a = barewire::engine::spawn_local(async move {
    ///         let (tx, _rx) = a.open_channel::<u64>(opts).await.unwrap();
    ///         tx.send(&42).await.unwrap();
    ///         tx.flush().await.unwrap();
    ///     });
    ///     let (_tx, rx) = b.open_channel::<u64>(opts).await.unwrap();
    ///     assert_eq!(rx.recv().await.unwrap(), 42);
    ///     at_a.await.unwrap();
    /// });
    /// ```
    pub async fn loopback_pair(cfg: &DriverConfig) -> Result<([Node; 2], Endpoint, Endpoint)> {
        let a = Node::with_config(cfg)?;
        let b = Node::with_config(cfg)?;
        let port = a.listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let accepted = barewire_engine::spawn_local(async move {
            let ep = a.accept().await;
            (a, ep)
        });
        let eb = match b.connect(SocketAddr::from(([127, 0, 0, 1], port))).await {
            Ok(eb) => eb,
            Err(e) => {
                accepted.cancel();
                return Err(e);
            }
        };
        let (a, ea) = accepted
            .await
            .map_err(|e| Error::Invalid(format!("the accepting task failed: {e}")))?;
        Ok(([a, b], ea?, eb))
    }
}
