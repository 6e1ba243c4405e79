//! A small blocking remoting client for the admin command: one `std::net::TcpStream` per
//! address, kept open for the command's lifetime, requests sent one at a time with our own
//! codec (JSON headers, `"language":"JAVA"`, version 479) and answered in order.
//!
//! Runs on the CLI's one thread; no runtime. Every wait is bounded by the timeout given at
//! construction (connect, write and each read), and every frame by the codec's 16 MiB limit.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::remoting::{decode_frame, response_code, response_code_name, FrameEncoder};

/// Bytes read from the socket per read call.
const READ_CHUNK_BYTES: usize = 64 * 1024;

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

/// One connection to one server.
struct Link {
    stream: TcpStream,
    buffer: Vec<u8>,
}

/// Connections to every server the command talks to, by address.
pub struct Client {
    timeout: Duration,
    links: BTreeMap<String, Link>,
    next_opaque: i32,
}

fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("bad address {addr:?} (want host:port)"))?
        .next()
        .ok_or_else(|| anyhow!("address {addr:?} resolves to nothing"))
}

impl Client {
    pub fn new(timeout: Duration) -> Client {
        Client {
            timeout,
            links: BTreeMap::new(),
            next_opaque: 1,
        }
    }

    fn link(&mut self, addr: &str) -> anyhow::Result<&mut Link> {
        if !self.links.contains_key(addr) {
            let socket = resolve(addr)?;
            let stream = TcpStream::connect_timeout(&socket, self.timeout)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(self.timeout))?;
            stream.set_write_timeout(Some(self.timeout))?;
            self.links.insert(
                addr.to_string(),
                Link {
                    stream,
                    buffer: Vec::new(),
                },
            );
        }
        self.links
            .get_mut(addr)
            .ok_or_else(|| anyhow!("connection to {addr} vanished"))
    }

    /// Sends one request to `addr` and waits for its answer. A connection that failed is
    /// dropped, so the next call to that address connects again.
    pub fn call(
        &mut self,
        addr: &str,
        code: i32,
        ext: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Reply> {
        let opaque = self.next_opaque;
        self.next_opaque = self.next_opaque.wrapping_add(1);
        let timeout = self.timeout;
        let result = self
            .link(addr)
            .and_then(|link| exchange(link, opaque, code, ext, body, timeout));
        if result.is_err() {
            self.links.remove(addr);
        }
        result
    }
}

fn exchange(
    link: &mut Link,
    opaque: i32,
    code: i32,
    ext: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> anyhow::Result<Reply> {
    let mut frame = Vec::with_capacity(256 + body.len());
    let mut encoder = FrameEncoder::request(&mut frame, code, opaque, false);
    for (key, value) in ext {
        encoder.ext(key, value);
    }
    encoder.finish(body);
    link.stream.write_all(&frame)?;
    let deadline = Instant::now() + timeout;
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        while let Some((command, consumed)) = decode_frame(&link.buffer)? {
            let reply = (command.is_response() && command.opaque == opaque).then(|| Reply {
                code: command.code,
                remark: command.remark.map(|r| r.into_owned()),
                ext: command
                    .ext_fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                body: command.body.to_vec(),
            });
            // Anything else (a server-to-client request, a late answer) is skipped.
            link.buffer.drain(..consumed);
            if let Some(reply) = reply {
                return Ok(reply);
            }
        }
        if Instant::now() >= deadline {
            bail!("no answer within {} ms", timeout.as_millis());
        }
        let read = link.stream.read(&mut chunk)?;
        if read == 0 {
            bail!("the server closed the connection");
        }
        link.buffer.extend_from_slice(&chunk[..read]);
    }
}
