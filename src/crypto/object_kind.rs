//! What a stored object is. The kind is written into every envelope and bound into its AEAD
//! associated data, so a block cannot be passed off as a head, nor a journal as a snapshot.
//!
//! The discriminants are on-store format: never renumber or reuse one.

use std::fmt;

/// What an object is; bound into the AEAD associated data so objects cannot be swapped.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    Block = 1,
    PackTrailer = 2,
    IndexSegment = 3,
    Journal = 4,
    Snapshot = 5,
    Head = 6,
    Lease = 7,
    Metadata = 8,
    /// A workspace history object: git objects of code and configs (history module).
    History = 9,
    /// A workspace's hot set: the chunks its last node held, for a refill after a reset.
    HotSet = 10,
}

impl ObjectKind {
    pub const ALL: [ObjectKind; 10] = [
        ObjectKind::Block,
        ObjectKind::PackTrailer,
        ObjectKind::IndexSegment,
        ObjectKind::Journal,
        ObjectKind::Snapshot,
        ObjectKind::Head,
        ObjectKind::Lease,
        ObjectKind::Metadata,
        ObjectKind::History,
        ObjectKind::HotSet,
    ];

    /// The envelope byte.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The kind an envelope byte names, if any.
    pub const fn from_u8(byte: u8) -> Option<ObjectKind> {
        Some(match byte {
            1 => ObjectKind::Block,
            2 => ObjectKind::PackTrailer,
            3 => ObjectKind::IndexSegment,
            4 => ObjectKind::Journal,
            5 => ObjectKind::Snapshot,
            6 => ObjectKind::Head,
            7 => ObjectKind::Lease,
            8 => ObjectKind::Metadata,
            9 => ObjectKind::History,
            10 => ObjectKind::HotSet,
            _ => return None,
        })
    }

    /// A lowercase name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            ObjectKind::Block => "block",
            ObjectKind::PackTrailer => "pack trailer",
            ObjectKind::IndexSegment => "index segment",
            ObjectKind::Journal => "journal",
            ObjectKind::Snapshot => "snapshot",
            ObjectKind::Head => "head",
            ObjectKind::Lease => "lease",
            ObjectKind::Metadata => "metadata",
            ObjectKind::History => "history",
            ObjectKind::HotSet => "hot set",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_round_trips_and_unknown_bytes_are_rejected() {
        for kind in ObjectKind::ALL {
            assert_eq!(ObjectKind::from_u8(kind.as_u8()), Some(kind));
        }
        assert_eq!(ObjectKind::from_u8(0), None);
        assert_eq!(ObjectKind::from_u8(11), None);
    }
}
