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
