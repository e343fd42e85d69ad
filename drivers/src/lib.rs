//! One verbs-shaped API over RDMA hardware and the software provider. Filled by the drivers issue.
