//! Newtypes for the values from different spaces that meet in the store's API and could be
//! swapped without a compiler noticing: a commitlog offset (bytes into a shard's log), a queue
//! offset (a message's index in its consume queue), a queue id and a shard id. They cost
//! nothing at run time; `.0` (or `get`) is the number, for the wire and for arithmetic.

use std::fmt;

macro_rules! newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl $name {
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$inner> for $name {
            fn from(value: $inner) -> Self {
                $name(value)
            }
        }

        // Comparing with the bare number (what arrives on the wire, what a test expects) is
        // fine; comparing two offsets of different spaces stays a type error.
        impl PartialEq<$inner> for $name {
            fn eq(&self, other: &$inner) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for $inner {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialOrd<$inner> for $name {
            fn partial_cmp(&self, other: &$inner) -> Option<std::cmp::Ordering> {
                self.0.partial_cmp(other)
            }
        }
    };
}

/// Offset arithmetic: an offset plus or minus a count is an offset of the same space; the
/// distance between two offsets of one space is a count.
macro_rules! offset_arithmetic {
    ($name:ident($inner:ty)) => {
        impl std::ops::Add<$inner> for $name {
            type Output = $name;
            fn add(self, count: $inner) -> $name {
                $name(self.0 + count)
            }
        }

        impl std::ops::AddAssign<$inner> for $name {
            fn add_assign(&mut self, count: $inner) {
                self.0 += count;
            }
        }

        impl std::ops::Sub<$inner> for $name {
            type Output = $name;
            fn sub(self, count: $inner) -> $name {
                $name(self.0 - count)
            }
        }

        impl std::ops::Sub for $name {
            type Output = $inner;
            fn sub(self, other: $name) -> $inner {
                self.0 - other.0
            }
        }

        impl std::ops::Rem<$inner> for $name {
            type Output = $inner;
            fn rem(self, modulus: $inner) -> $inner {
                self.0 % modulus
            }
        }
    };
}

newtype!(
    /// A byte offset in a shard's commitlog (RocketMQ's physical offset): where a record
    /// starts, or where one ends.
    CommitLogOffset(u64)
);
newtype!(
    /// A message's index in its consume queue (RocketMQ's queue offset), which consumers
    /// commit and pull from.
    QueueOffset(u64)
);
newtype!(
    /// A queue of a topic (RocketMQ's queueId).
    QueueId(u32)
);
newtype!(
    /// A shard of this node: shard i is pinned to one core and is broker endpoint i.
    ShardId(usize)
);

offset_arithmetic!(CommitLogOffset(u64));
offset_arithmetic!(QueueOffset(u64));

impl CommitLogOffset {
    /// The offset `bytes` further on.
    pub const fn plus(self, bytes: u64) -> CommitLogOffset {
        CommitLogOffset(self.0 + bytes)
    }
}

impl QueueOffset {
    /// The next offset.
    pub const fn next(self) -> QueueOffset {
        QueueOffset(self.0 + 1)
    }
}
