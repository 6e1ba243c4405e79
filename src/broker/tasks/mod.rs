//! The shard's background tasks: registration with the namesrv, delivery of delayed and timer
//! messages, transaction checks, SYNC_FLUSH answers after their group commit, the ticking
//! task (the long-poll wheel's clock and the overload gauge) and retention (with the disk
//! monitor).

pub mod delay_delivery;
pub mod durable;
pub mod registration;
pub mod retention;
pub mod ticking;
pub mod transaction_checks;
