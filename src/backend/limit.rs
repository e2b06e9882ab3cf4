//! [`SizeLimit`]: the most bytes a whole-object GET may return, and what the object is (for
//! the message that refuses a bigger one).
//!
//! A store is input: an object it serves may be of any size, whatever was written there. Every
//! whole-object read of this layer takes a limit, learns the object's size from the answer's
//! metadata before reading its body, refuses an object over the limit as
//! [`BackendError::Corrupt`](super::BackendError::Corrupt) naming its key and both sizes, and
//! reads the body into no more than the size it was told (a body that runs past it is refused
//! too). This layer knows no formats: the limits of the store's object kinds are defined, with
//! their reasons, by the layer that owns those formats (`crate::store::limits`).

/// The most bytes a whole-object read accepts, and what it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeLimit {
    /// Larger objects are refused before their body is read.
    pub max_len: u64,
    /// What the object is, for messages: "a lease record", "a shard of this pack".
    pub what: &'static str,
}

impl SizeLimit {
    /// An object of exactly this length is expected (a pack or shard whose length the index
    /// records); anything longer is refused unread, a shorter one is read for the caller's check.
    pub const fn exactly(len: u64, what: &'static str) -> SizeLimit {
        SizeLimit { max_len: len, what }
    }

    /// Why an object of `size` bytes is refused (the key and backend are named by the caller).
    pub(crate) fn refusal(&self, size: u64) -> String {
        format!("it holds {size} bytes, more than the {} bytes {} can be", self.max_len, self.what)
    }
}
