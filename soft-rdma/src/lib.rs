//! The software RDMA provider (iWARP over TCP). Filled by the wire codec and provider issues.
