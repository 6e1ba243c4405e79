//! The shard's background tasks: registration with the namesrv, delivery of delayed and timer
//! messages, transaction checks, SYNC_FLUSH answers after their group commit, and the ticking
//! task (the long-poll wheel's clock and the overload gauge).

pub mod delay_delivery;
pub mod durable;
pub mod registration;
pub mod ticking;
pub mod transaction_checks;
