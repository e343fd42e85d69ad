//! The queue-pair state machine of ibv_modify_qp(3), for reliable-connected queue pairs.
//!
//! ```text
//!            +--------------------- any state -> RESET, any state -> ERROR --------+
//!            v                                                                      |
//!  RESET -> INIT -> RTR -> RTS      (INIT -> INIT and RTS -> RTS change attributes)
//! ```
//! In RESET nothing may be posted; in INIT receives may be posted but nothing is processed; in
//! RTR receives are processed; in RTS sends too. In ERROR every outstanding and newly posted
//! work request completes with `WR_FLUSH_ERR`.

/// A queue pair's state.
///
/// ```
/// use barewire_rdma_types::QpState;
/// let s = QpState::Reset.transition(QpState::Init).unwrap();
/// assert!(s.can_post_recv() && !s.can_post_send());
/// let s = s.transition(QpState::Rtr).unwrap().transition(QpState::Rts).unwrap();
/// assert!(s.can_post_send());
/// assert!(QpState::Init.transition(QpState::Rts).is_err()); // not without RTR
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Just created, or reset.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Broken: everything flushes.
    Error,
}

/// A transition ibv_modify_qp(3) does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("queue pair cannot go from {from:?} to {to:?}")]
pub struct QpTransitionError {
    /// The current state.
    pub from: QpState,
    /// The requested state.
    pub to: QpState,
}

impl QpState {
    /// The state after asking for `to`, or why not.
    pub fn transition(self, to: QpState) -> Result<QpState, QpTransitionError> {
        use QpState::*;
        match (self, to) {
            (_, Reset)
            | (_, Error)
            | (Reset, Init)
            | (Init, Init)
            | (Init, Rtr)
            | (Rtr, Rts)
            | (Rts, Rts) => Ok(to),
            _ => Err(QpTransitionError { from: self, to }),
        }
    }

    /// Receives may be posted.
    pub fn can_post_recv(self) -> bool {
        matches!(
            self,
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Error
        )
    }

    /// Sends may be posted (in ERROR they complete at once with a flush error).
    pub fn can_post_send(self) -> bool {
        matches!(self, QpState::Rts | QpState::Error)
    }

    /// Incoming messages are processed.
    pub fn receives(self) -> bool {
        matches!(self, QpState::Rtr | QpState::Rts)
    }
}

#[cfg(test)]
mod tests {
    use super::QpState::*;
    use super::*;

    #[test]
    fn the_verbs_transitions_and_only_those() {
        let all = [Reset, Init, Rtr, Rts, Error];
        let allowed = |f: QpState, t: QpState| {
            matches!(
                (f, t),
                (_, Reset)
                    | (_, Error)
                    | (Reset, Init)
                    | (Init, Init)
                    | (Init, Rtr)
                    | (Rtr, Rts)
                    | (Rts, Rts)
            )
        };
        for f in all {
            for t in all {
                assert_eq!(f.transition(t).is_ok(), allowed(f, t), "{f:?} -> {t:?}");
            }
        }
        // The normal life of a connected QP.
        let s = Reset
            .transition(Init)
            .and_then(|s| s.transition(Rtr))
            .and_then(|s| s.transition(Rts))
            .unwrap();
        assert!(s.can_post_send() && s.receives());
        assert_eq!(
            Rts.transition(Rtr),
            Err(QpTransitionError { from: Rts, to: Rtr })
        );
        assert!(!Reset.can_post_recv() && Init.can_post_recv() && !Init.receives());
    }
}
