//! Shared by every integration test that runs the real binary: [`node`] starts `shardmq` on
//! a free port block with its own data directory (killed and removed with the test),
//! [`frames`] sends request frames built by our codec and reads the replies, and [`client`]
//! holds the options and message logs of the tests of our client library.
//!
//! Each test file includes it with `mod common;` and uses what it needs: the raw-frame tests
//! `use crate::common::*`, the client tests `crate::common::Node` and `crate::common::client::*`.
#![allow(dead_code)]

pub mod client;
pub mod frames;
pub mod node;

// Not every test file uses both (the client tests use neither glob).
#[allow(unused_imports)]
pub use frames::*;
#[allow(unused_imports)]
pub use node::*;

use std::time::{Duration, Instant};

/// Longest a test waits for a broker state it expects.
pub const STATE_WAIT: Duration = Duration::from_secs(10);

/// Waits until the shard listening on `port` holds at least `count` parked pulls (its
/// GET_BROKER_RUNTIME_INFO `parkedPulls`): the state a test waits on, instead of sleeping
/// until a pull has probably been parked.
pub fn wait_for_parked_pulls(port: u16, count: u64) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let held = eventually(STATE_WAIT, || {
        frames::runtime_info(&mut stream, "parkedPulls")
            .parse::<u64>()
            .is_ok_and(|parked| parked >= count)
    });
    assert!(held, "fewer than {count} parked pull(s) on port {port}");
}

/// Polls `check` every 10 ms until it holds or `within` passes; true if it held.
pub fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
