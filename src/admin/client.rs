//! The admin command's requests, one at a time, through the Rust client's remoting transport
//! (`shardmq_client::connection`: one connection per address, kept for the command's
//! lifetime, the same codec and headers as the client library), on a current-thread tokio
//! runtime the command blocks on. Every wait is bounded by the timeout given at construction.

use std::collections::BTreeMap;
use std::time::Duration;

use shardmq_client::connection::{RemotingClient, Request};

use crate::remoting::{response_code, response_code_name};

/// A decoded answer, owned.
#[derive(Debug, Clone)]
pub struct Reply {
    pub code: i32,
    pub remark: Option<String>,
    pub ext: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn is_success(&self) -> bool {
        self.code == response_code::SUCCESS
    }

    /// The response code's RocketMQ name and number, with the remark: for error messages.
    pub fn describe(&self) -> String {
        let name = response_code_name(self.code).unwrap_or("UNKNOWN");
        match self.remark.as_deref().filter(|r| !r.trim().is_empty()) {
            Some(remark) => format!("{name} ({}): {}", self.code, remark.trim()),
            None => format!("{name} ({})", self.code),
        }
    }

    /// An ext field parsed as a number.
    pub fn ext_i64(&self, key: &str) -> Option<i64> {
        self.ext.get(key).and_then(|v| v.trim().parse().ok())
    }
}

/// Connections to every server the command talks to, by address.
pub struct Client {
    timeout: Duration,
    runtime: tokio::runtime::Runtime,
    remoting: RemotingClient,
}

impl Client {
    pub fn new(
        timeout: Duration,
        credentials: Option<crate::remoting::signature::Credentials>,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Client {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread tokio runtime");
        // Requests the servers send us (none for admin) are dropped with the channel.
        let (server_requests, _) = tokio::sync::mpsc::channel(1);
        let remoting = runtime
            .block_on(async { RemotingClient::new(server_requests) })
            .with_credentials(credentials)
            .with_tls(tls);
        Client {
            timeout,
            runtime,
            remoting,
        }
    }

    /// Sends one request to `addr` and waits for its answer. A connection that failed is
    /// dropped by the transport, so the next call to that address connects again.
    pub fn call(
        &mut self,
        addr: &str,
        code: i32,
        ext: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Reply> {
        let mut request = Request::new(code).body(body.to_vec());
        for (key, value) in ext {
            request = request.ext(key, value);
        }
        let answer = self
            .runtime
            .block_on(self.remoting.invoke(addr, &request, self.timeout))?;
        Ok(Reply {
            code: answer.code,
            remark: answer.remark,
            ext: answer.ext.into_iter().collect(),
            body: answer.body,
        })
    }
}
