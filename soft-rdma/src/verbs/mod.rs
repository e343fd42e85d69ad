//! Verbs objects with rdma-core's semantics: protection domains, memory regions with access
//! flags and unpredictable STags, completion queues with `ibv_wc_status`-style statuses, and
//! the queue-pair state machine. Objects belong to one core (`!Send`), like everything the
//! engine runs.
//!
//! The objects themselves live in barewire-rdma-types, below every backend (the shared-memory
//! backend keeps its keys in the same tables); this module re-exports them and adds what only
//! the wire needs: the Terminate code for each protection violation.

pub use barewire_rdma_types::{
    Access, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpState, QpTransitionError,
    Stag, StagHasher, StagMap, Violation, WcOpcode, WcStatus, Window, WorkCompletion,
};

use crate::wire::{DdpTaggedErrorCode, RdmapErrorCode, RdmapErrorType, TermCode};

/// The Terminate codes of a protection violation.
pub trait ViolationTerm {
    /// The Terminate code for this violation on a tagged DDP segment (an RDMA WRITE or READ
    /// Response placing data): DDP layer codes where RFC 5041 has one, RDMAP's otherwise.
    fn tagged_term(self) -> TermCode;

    /// The Terminate code for this violation on an RDMAP request naming a source region (READ
    /// Request, atomics): RDMAP remote protection errors (RFC 5040 §7.2).
    fn rdmap_term(self) -> TermCode;
}

impl ViolationTerm for Violation {
    /// The Terminate code for this violation on a tagged DDP segment (an RDMA WRITE or READ
    /// Response placing data): DDP layer codes where RFC 5041 has one, RDMAP's otherwise.
    fn tagged_term(self) -> TermCode {
        match self {
            Violation::InvalidStag => TermCode::ddp_tagged(DdpTaggedErrorCode::InvalidStag),
            Violation::BaseBounds => TermCode::ddp_tagged(DdpTaggedErrorCode::BaseBounds),
            Violation::NotAssociated => TermCode::ddp_tagged(DdpTaggedErrorCode::StagNotAssociated),
            Violation::ToWrap => TermCode::ddp_tagged(DdpTaggedErrorCode::ToWrap),
            Violation::AccessRights => TermCode::rdmap(
                RdmapErrorType::RemoteProtection,
                RdmapErrorCode::AccessRights,
            ),
        }
    }

    /// The Terminate code for this violation on an RDMAP request naming a source region (READ
    /// Request, atomics): RDMAP remote protection errors (RFC 5040 §7.2).
    fn rdmap_term(self) -> TermCode {
        let code = match self {
            Violation::InvalidStag => RdmapErrorCode::InvalidStag,
            Violation::BaseBounds => RdmapErrorCode::BaseBounds,
            Violation::AccessRights => RdmapErrorCode::AccessRights,
            Violation::NotAssociated => RdmapErrorCode::StagNotAssociated,
            Violation::ToWrap => RdmapErrorCode::ToWrap,
        };
        TermCode::rdmap(RdmapErrorType::RemoteProtection, code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_map_to_the_rfc_terminate_codes() {
        assert_eq!(
            Violation::InvalidStag.tagged_term(),
            TermCode::ddp_tagged(DdpTaggedErrorCode::InvalidStag)
        );
        assert_eq!(
            Violation::AccessRights.rdmap_term(),
            TermCode::rdmap(
                RdmapErrorType::RemoteProtection,
                RdmapErrorCode::AccessRights
            )
        );
    }
}
