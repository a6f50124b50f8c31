//! Why a data plane did not confirm a routing, and the generation guard
//! every adapter applies before it writes.

/// Why a data plane did not confirm a routing.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("the webhook at {url} did not answer")]
    Unreachable { url: String },
    #[error("the webhook at {url} answered {status}: {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the data plane confirmed {got:?}, not {want:?}")]
    OtherVersion { want: String, got: String },
    #[error("{0}")]
    Io(String),
    /// The Kubernetes API server refused a write or a read: `why` is its
    /// message, which names the field (422: the schema refused a value;
    /// 409: another field manager owns a field, left as it is).
    #[error("the Kubernetes API server refused {object} ({code}): {why}")]
    Kubernetes {
        object: String,
        code: u16,
        why: String,
    },
    /// Written, but the data plane did not report it in force in time.
    #[error("not in force after {within:?}: {why}")]
    NotConfirmed {
        within: std::time::Duration,
        why: String,
    },
    /// This build of rollgate cannot drive the data plane's kind.
    #[error("this rollgate was built without the {0} data plane (cargo feature `kubernetes`)")]
    NotBuilt(&'static str),
    #[error("cannot route {upstream:?}: {why}")]
    Unroutable { upstream: String, why: String },
    /// The data plane holds a routing of a higher generation than this
    /// one's: written by a controller that read the store later. Left as
    /// it is; this routing is not confirmed.
    #[error(
        "the data plane holds a routing of generation {have}, newer than this one's ({want}): \
         left as it is (a controller that read the store later wrote it)"
    )]
    Stale { have: u64, want: u64 },
}

/// The guard of every write: `want` may replace a routing of generation
/// `have` only if it is not older.
pub(crate) fn not_older(have: u64, want: u64) -> Result<(), AdapterError> {
    if want < have {
        Err(AdapterError::Stale { have, want })
    } else {
        Ok(())
    }
}
