//! The namesrv role: a route table, replicated to every shard.
//!
//! Every shard binds the namesrv port (SO_REUSEPORT) and answers route queries from its own
//! replica. A change (registration, unregistration, KV config, topic delete) is applied where
//! it arrives and broadcast to the other replicas as a `RouteUpdate` over the mesh. Updates
//! carry the time of the registration they describe, so a late, older registration never
//! overwrites a newer one; each replica expires brokers on its own clock (120 s after their
//! last registration by default), so replicas converge without further coordination.

mod handlers;
mod table;

pub use handlers::NamesrvHandler;
pub use table::{BrokerRegistration, RouteTable, RouteUpdate, BROKER_EXPIRY_MS_DEFAULT};
