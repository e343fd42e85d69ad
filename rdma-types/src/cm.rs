//! What a listener refused, by reason: the same counters for every backend that keeps them.

/// What a listener took in and refused, by reason (cumulative since it was bound).
///
/// The software provider counts TCP connections and their MPA Requests; the shared-memory
/// backend counts connections to its Unix socket and their setup messages. Counters that do
/// not apply to a backend stay at zero.
///
/// ```
/// use barewire_rdma_types::ListenerCounters;
/// let soft = ListenerCounters { connections: 3, timed_out: 1, ..Default::default() };
/// let shm = ListenerCounters { connections: 2, evicted: 1, ..Default::default() };
/// let both = soft + shm;
/// assert_eq!((both.connections, both.timed_out, both.evicted), (5, 1, 1));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerCounters {
    /// Connections accepted from the kernel.
    pub connections: u64,
    /// Setups dropped at their deadline.
    pub timed_out: u64,
    /// Setups in progress evicted by newer connections (per-listener or per-source cap).
    pub evicted: u64,
    /// Connections whose setup message was malformed or refused, or that closed before
    /// sending it.
    pub bad_requests: u64,
    /// Complete setups dropped because `accept` fell too far behind.
    pub overflowed: u64,
    /// Protection violations by peers of this listener (soft answers each with a Terminate;
    /// shm counts a request for a key the peer may not use, and ends that connection).
    pub violations: u64,
    /// Connections refused because their address had spent its violation budget.
    pub banned: u64,
    /// Connections refused because the listener, or their address, had as many open as allowed.
    pub over_limit: u64,
}

impl std::ops::Add for ListenerCounters {
    type Output = ListenerCounters;

    /// Field by field: the counters of two listeners on one port, as one.
    fn add(self, o: ListenerCounters) -> ListenerCounters {
        ListenerCounters {
            connections: self.connections + o.connections,
            timed_out: self.timed_out + o.timed_out,
            evicted: self.evicted + o.evicted,
            bad_requests: self.bad_requests + o.bad_requests,
            overflowed: self.overflowed + o.overflowed,
            violations: self.violations + o.violations,
            banned: self.banned + o.banned,
            over_limit: self.over_limit + o.over_limit,
        }
    }
}
