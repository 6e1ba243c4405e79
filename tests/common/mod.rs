//! Shared by every integration test that runs the real binary: [`node`] starts `shardmq` on
//! a free port block with its own data directory (killed and removed with the test),
//! [`frames`] sends request frames built by our codec and reads the replies, and [`client`]
//! holds the options and message logs of the tests of our client library.
//!
//! Each test file includes it with `mod common;` and uses what it needs: the raw-frame tests
//! `use common::*`, the client tests `common::Node` and `common::client::*`.
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
