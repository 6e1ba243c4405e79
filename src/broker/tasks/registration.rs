//! Registration of one shard's broker with every namesrv: REGISTER_BROKER at start, 10 s
//! later, then every 30 s with every topic, and with just the changed ones whenever topics
//! change; UNREGISTER_BROKER at shutdown.
//! One long-lived connection per namesrv (a Java namesrv drops a broker whose connection
//! closes), re-opened when it breaks.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use shards::runtime::{self, TcpStream};

use crate::body::RegisterBrokerBody;
use crate::broker::Broker;
use crate::remoting::{decode_frame, request_code, response_code, FrameEncoder};

/// RocketMQ's registerNameServerPeriod.
pub const REGISTER_PERIOD_MS: u64 = 30_000;

/// The second registration comes this soon after the first (as Java brokers do).
pub const FIRST_REREGISTER_DELAY_MS: u64 = 10_000;

/// How long we wait for a namesrv to answer.
pub const NAMESRV_REQUEST_TIMEOUT_MS: u64 = 3_000;

/// How long we tell the namesrv to keep us without news.
pub const HEARTBEAT_TIMEOUT_MS: i64 = 120_000;

pub use crate::limits::NAMESRV_RESPONSE_MAX_BYTES;

/// A request/response connection to one namesrv.
pub struct NamesrvConnection {
    pub(crate) addr: SocketAddr,
    pub(crate) stream: Option<TcpStream>,
    pub(crate) next_opaque: i32,
    /// TLS towards the namesrv (`--tls-enable`), and the session of the open connection.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    session: Option<rustls::ClientConnection>,
}

impl NamesrvConnection {
    pub fn new(addr: SocketAddr, tls: Option<std::sync::Arc<rustls::ClientConfig>>) -> Self {
        NamesrvConnection {
            addr,
            stream: None,
            next_opaque: 1,
            tls,
            session: None,
        }
    }

    /// Sends one request built by `build` (given the opaque) and returns (code, remark).
    pub async fn call(
        &mut self,
        build: impl Fn(&mut Vec<u8>, i32),
    ) -> Result<(i32, Option<String>), String> {
        self.call_for_fields(build)
            .await
            .map(|answer| (answer.code, answer.remark))
    }

    /// [`NamesrvConnection::call`], with the answer's ext fields.
    pub async fn call_for_fields(
        &mut self,
        build: impl Fn(&mut Vec<u8>, i32),
    ) -> Result<NamesrvAnswer, String> {
        let timeout = Duration::from_millis(NAMESRV_REQUEST_TIMEOUT_MS);
        let result = runtime::timeout(timeout, self.call_inner(build)).await;
        let result = result.unwrap_or_else(|| Err(format!("no answer from {} in time", self.addr)));
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    pub(crate) async fn call_inner(
        &mut self,
        build: impl Fn(&mut Vec<u8>, i32),
    ) -> Result<NamesrvAnswer, String> {
        if self.stream.is_none() {
            let mut stream = runtime::connect(self.addr)
                .await
                .map_err(|e| e.to_string())?;
            let _ = stream.set_nodelay(true);
            self.session = None;
            if let Some(config) = &self.tls {
                let name = rustls::pki_types::ServerName::from(self.addr.ip());
                let mut session = rustls::ClientConnection::new(config.clone(), name)
                    .map_err(|e| format!("TLS: {e}"))?;
                crate::tls::session::handshake(&mut stream, &mut session).await?;
                self.session = Some(session);
            }
            self.stream = Some(stream);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err("not connected".into());
        };
        let opaque = self.next_opaque;
        self.next_opaque = self.next_opaque.wrapping_add(1);
        let mut frame = Vec::new();
        build(&mut frame, opaque);
        match &mut self.session {
            None => stream.write_all(&frame).await.map_err(|e| e.to_string())?,
            Some(session) => {
                std::io::Write::write_all(&mut session.writer(), &frame)
                    .map_err(|e| format!("TLS: {e}"))?;
                crate::tls::session::flush(stream, session).await?;
            }
        }
        let mut buffer = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let read = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if read == 0 {
                return Err("namesrv closed the connection".into());
            }
            match &mut self.session {
                None => buffer.extend_from_slice(&chunk[..read]),
                Some(session) => crate::tls::session::feed(session, &chunk[..read], &mut buffer)?,
            }
            if buffer.len() > NAMESRV_RESPONSE_MAX_BYTES {
                return Err("namesrv answer too large".into());
            }
            let mut consumed = 0;
            while let Some((command, length)) =
                decode_frame(&buffer[consumed..]).map_err(|e| e.to_string())?
            {
                consumed += length;
                if command.is_response() && command.opaque == opaque {
                    let ext = command.ext_fields.iter();
                    return Ok(NamesrvAnswer {
                        code: command.code,
                        remark: command.remark.map(|r| r.into_owned()),
                        ext: ext.map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                        body: command.body.to_vec(),
                    });
                }
            }
            buffer.drain(..consumed);
        }
    }
}

/// A namesrv's answer.
pub struct NamesrvAnswer {
    pub code: i32,
    pub remark: Option<String>,
    pub ext: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl NamesrvAnswer {
    pub fn ext(&self, key: &str) -> Option<&str> {
        let found = self.ext.iter().find(|(k, _)| k == key);
        found.map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }
}

/// This shard's haServerAddr: its broker IP and HA port.
pub(crate) fn ha_addr(broker: &Broker) -> String {
    let address = std::net::SocketAddr::V4(broker.identity.address);
    broker.ha.config.listen_address(address).to_string()
}

/// Pause before retrying a first registration that failed (a namesrv still starting),
/// doubled after each failure up to REGISTER_RETRY_DELAY_MAX_MS.
pub(crate) const REGISTER_RETRY_DELAY_MS: u64 = 200;

pub(crate) const REGISTER_RETRY_DELAY_MAX_MS: u64 = 5_000;

/// The registration loop of one shard; runs until the process stops. `on_first_success`
/// runs once, after every namesrv has accepted the first registration.
pub async fn run(
    broker: Rc<Broker>,
    namesrv_addrs: Vec<SocketAddr>,
    on_first_success: impl FnOnce(),
) {
    let mut namesrvs: Vec<NamesrvConnection> = namesrv_addrs
        .into_iter()
        .map(|addr| NamesrvConnection::new(addr, broker.namesrv_tls.clone()))
        .collect();
    let mut retry_delay_ms = REGISTER_RETRY_DELAY_MS;
    while !broker.register_with_all(&mut namesrvs, None).await {
        runtime::sleep(Duration::from_millis(retry_delay_ms)).await;
        retry_delay_ms = (retry_delay_ms * 2).min(REGISTER_RETRY_DELAY_MAX_MS);
    }
    on_first_success();
    let mut next_full = Instant::now() + Duration::from_millis(FIRST_REREGISTER_DELAY_MS);
    loop {
        let left = next_full.saturating_duration_since(Instant::now());
        let signalled = futures_lite::future::or(
            async {
                runtime::sleep(left).await;
                false
            },
            async {
                broker.registration.wake.wait().await;
                true
            },
        )
        .await;
        let changed = std::mem::take(&mut *broker.registration.changed_topics.borrow_mut());
        let full_due = broker.registration.full_due.take();
        let full = !signalled || changed.is_empty() || full_due;
        let accepted = broker
            .register_with_all(&mut namesrvs, (!full).then_some(&changed))
            .await;
        if !accepted {
            // What a refused increment carried goes with the next registration, in full.
            broker.registration.full_due.set(true);
        }
        if full {
            next_full = Instant::now() + Duration::from_millis(REGISTER_PERIOD_MS);
        }
    }
}

/// What the registration task is asked to register between its periodic full registrations.
#[derive(Default)]
pub struct RegistrationRequests {
    wake: shards::sync::Signal,
    /// Topics created or changed since the last registration: an increment carries only
    /// these (RocketMQ's registerIncrementBrokerData), so creating thousands of topics does
    /// not send the whole table each time; the namesrv merges them into the routes.
    changed_topics: RefCell<BTreeSet<String>>,
    /// The next registration is a full one (a topic went, or an increment was refused).
    full_due: Cell<bool>,
}

impl RegistrationRequests {
    /// Asks for a registration carrying `topic` soon.
    pub fn topic_changed(&self, topic: &str) {
        self.changed_topics.borrow_mut().insert(topic.to_string());
        self.wake.notify();
    }

    /// Asks for a full registration soon.
    pub fn everything(&self) {
        self.full_due.set(true);
        self.wake.notify();
    }
}

impl Broker {
    pub(crate) fn encode_registration(&self, out: &mut Vec<u8>, opaque: i32, body: &[u8]) {
        let identity = &self.identity;
        let crc = crc32fast::hash(body) & 0x7FFF_FFFF;
        let fields = vec![
            ("brokerName", identity.broker_name.clone()),
            ("brokerAddr", identity.address.to_string()),
            ("clusterName", identity.cluster_name.clone()),
            ("haServerAddr", ha_addr(self)),
            ("brokerId", self.ha.broker_id().to_string()),
            ("heartbeatTimeoutMillis", HEARTBEAT_TIMEOUT_MS.to_string()),
            ("compressed", "false".to_string()),
            ("bodyCrc32", crc.to_string()),
        ];
        self.encode_namesrv_request(out, request_code::REGISTER_BROKER, opaque, fields, body);
    }

    pub(crate) fn encode_unregistration(&self, out: &mut Vec<u8>, opaque: i32) {
        let identity = &self.identity;
        let fields = vec![
            ("brokerName", identity.broker_name.clone()),
            ("brokerAddr", identity.address.to_string()),
            ("clusterName", identity.cluster_name.clone()),
            ("brokerId", self.ha.broker_id().to_string()),
        ];
        self.encode_namesrv_request(out, request_code::UNREGISTER_BROKER, opaque, fields, &[]);
    }

    /// One request to a namesrv, signed when this broker has namesrv credentials.
    pub(crate) fn encode_namesrv_request(
        &self,
        out: &mut Vec<u8>,
        code: i32,
        opaque: i32,
        fields: Vec<(&str, String)>,
        body: &[u8],
    ) {
        let mut fields: Vec<(String, String)> = fields
            .into_iter()
            .map(|(key, value)| (key.to_string(), value))
            .collect();
        if let Some(credentials) = &self.namesrv_credentials {
            credentials.sign_request(&mut fields, body);
        }
        let mut frame = FrameEncoder::request(out, code, opaque, false);
        for (key, value) in &fields {
            frame.ext(key, value);
        }
        frame.finish(body);
    }

    /// Registers with every namesrv, with every topic or `only` those; true when all of
    /// them accepted.
    pub(crate) async fn register_with_all(
        &self,
        namesrvs: &mut [NamesrvConnection],
        only: Option<&BTreeSet<String>>,
    ) -> bool {
        let mut all_accepted = true;
        let topic_config_table = match only {
            None => self.topics.borrow().snapshot(),
            Some(names) => self.topics.borrow().snapshot_of(names),
        };
        let body = RegisterBrokerBody {
            topic_config_table,
            filter_server_list: Vec::new(),
        }
        .encode();
        for namesrv in namesrvs.iter_mut() {
            let result = namesrv
                .call_for_fields(|out, opaque| self.encode_registration(out, opaque, &body))
                .await;
            if let Ok(answer) = &result {
                if answer.code == response_code::SUCCESS {
                    self.learn_master(answer);
                }
                self.note_registration_answer(answer.code, answer.remark.as_deref());
            }
            let result = result.map(|answer| (answer.code, answer.remark));
            all_accepted &= matches!(result, Ok((response_code::SUCCESS, _)));
            match result {
                Ok((response_code::SUCCESS, _)) => {}
                Ok((code, remark)) => log::warn!(
                    "{}: namesrv {} refused the registration: code {code} {}",
                    self.identity.broker_name,
                    namesrv.addr,
                    remark.unwrap_or_default()
                ),
                Err(error) => log::warn!(
                    "{}: cannot register with namesrv {}: {error}",
                    self.identity.broker_name,
                    namesrv.addr
                ),
            }
        }
        all_accepted
    }

    /// A slave learns its master's addresses from the namesrv's answer (`masterAddr`,
    /// `haServerAddr`), as RocketMQ's BrokerController.updateMasterHAServerAddrPeriodically
    /// does, unless haMasterAddress was given.
    fn learn_master(&self, answer: &NamesrvAnswer) {
        if !self.ha.is_slave() {
            return;
        }
        let parse = |key: &str| answer.ext(key).and_then(|v| v.parse::<SocketAddr>().ok());
        let master = &self.ha.master;
        if let Some(address) = parse("masterAddr") {
            let changed = *master.broker_address.borrow() != Some(address);
            if changed {
                log::info!("{}: master is {address}", self.identity.broker_name);
                *master.broker_address.borrow_mut() = Some(address);
            }
            if self.ha.config.master_address.is_none() {
                // The namesrv gives the master's haServerAddr; RocketMQ's is its port + 1.
                let ha = parse("haServerAddr").unwrap_or(crate::ha::ha_address_of(address));
                *master.ha_address.borrow_mut() = Some(ha);
            }
        }
    }

    /// Unregisters from every namesrv (best effort, at shutdown).
    pub async fn unregister_from_all(&self, namesrvs: &mut [NamesrvConnection]) {
        for namesrv in namesrvs.iter_mut() {
            let _ = namesrv
                .call(|out, opaque| self.encode_unregistration(out, opaque))
                .await;
        }
    }
}
