//! TLS on the node's ports (rustls), with RocketMQ's modes and keys (CAPABILITIES.md §4.6,
//! `TlsSystemConfig`): `tls.server.mode` disabled | permissive (the default: the first byte
//! of a connection tells a TLS handshake, 0x16, from a plaintext frame, whose length word
//! starts with 0x00 for every frame we accept) | enforcing (plaintext is refused);
//! `tls.server.certPath` / `keyPath`; `tls.server.need.client.auth` none | optional |
//! require, against `tls.server.trustCertPath`; `tls.test.mode.enable` (the default): with no
//! certificate given, a self-signed one is made at start (for `localhost`, 127.0.0.1 and the
//! broker's address) and written beside the data as `tls/test-cert.pem`, so a client can
//! trust it.
//!
//! The session itself is rustls's sans-I/O `ServerConnection`, driven by the connection's
//! read and write tasks (`server.rs`) below the frame codec.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The first byte of a TLS record carrying a handshake (a ClientHello).
pub const TLS_HANDSHAKE_BYTE: u8 = 0x16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    Disabled,
    Permissive,
    Enforcing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientAuth {
    None,
    Optional,
    Require,
}

/// What the command line asked for.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    pub mode: TlsMode,
    pub cert_path: Option<PathBuf>,
    pub key_path: Option<PathBuf>,
    pub need_client_auth: ClientAuth,
    pub trust_cert_path: Option<PathBuf>,
    pub test_mode: bool,
}

/// The TLS side of every listener of a node.
#[derive(Debug)]
pub struct TlsServer {
    pub mode: TlsMode,
    pub config: Arc<rustls::ServerConfig>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The node's TLS settings (`None` when disabled). `names` are the addresses a test-mode
/// certificate is made for (besides localhost and 127.0.0.1); it is written to `data_dir`.
pub fn server(
    options: &TlsOptions,
    names: &[String],
    data_dir: &Path,
) -> Result<Option<Arc<TlsServer>>, String> {
    if options.mode == TlsMode::Disabled {
        return Ok(None);
    }
    let (certs, key, origin) = match (&options.cert_path, &options.key_path) {
        (Some(cert_path), Some(key_path)) => {
            let certs = read_certs(cert_path)?;
            let key = PrivateKeyDer::from_pem_file(key_path)
                .map_err(|e| format!("tls.server.keyPath {}: {e}", key_path.display()))?;
            (certs, key, format!("certificate {}", cert_path.display()))
        }
        (None, None) if options.test_mode => {
            let (cert, key, written) = self_signed(names, data_dir)?;
            (
                vec![cert],
                key,
                format!("self-signed test certificate {written}"),
            )
        }
        (None, None) => {
            return Err("TLS is on (tls.server.mode) but has no certificate: give \
                 --tls-server-cert-path and --tls-server-key-path, or --tls-test-mode-enable true"
                .into())
        }
        _ => return Err("--tls-server-cert-path and --tls-server-key-path go together".into()),
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match options.need_client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        auth => {
            let trust = options.trust_cert_path.as_ref().ok_or(
                "tls.server.need.client.auth needs tls.server.trustCertPath \
                 (--tls-server-trust-cert-path): the CA client certificates must chain to",
            )?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(trust)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("tls.server.trustCertPath {}: {e}", trust.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            );
            let verifier = match auth {
                ClientAuth::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| e.to_string())?)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate and key do not go together: {e}"))?;
    log::info!(
        "TLS {:?} on every port ({origin}; client certificates: {:?})",
        options.mode,
        options.need_client_auth
    );
    Ok(Some(Arc::new(TlsServer {
        mode: options.mode,
        config: Arc::new(config),
    })))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// A self-signed certificate for `localhost`, 127.0.0.1 and `names`, written (PEM) to
/// `data_dir/tls/test-cert.pem` for clients to trust; with where it went, or why not: a file
/// that cannot be written (a full disk) does not stop the node, and the previous one stays.
fn self_signed(
    names: &[String],
    data_dir: &Path,
) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>, String), String> {
    let mut subject_names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    for name in names {
        if !subject_names.contains(name) {
            subject_names.push(name.clone());
        }
    }
    let made = || -> Result<rcgen::CertifiedKey, rcgen::Error> {
        let mut params = rcgen::CertificateParams::new(subject_names)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "shardmq TLS test mode");
        let key_pair = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key_pair)?;
        Ok(rcgen::CertifiedKey { cert, key_pair })
    };
    let certified = made().map_err(|e| format!("cannot make a test certificate: {e}"))?;
    let dir = data_dir.join("tls");
    let path = dir.join("test-cert.pem");
    let temp = dir.join("test-cert.pem.tmp");
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&temp, certified.cert.pem()))
        .and_then(|()| std::fs::rename(&temp, &path));
    let written = match written {
        Ok(()) => path.display().to_string(),
        Err(error) => {
            let _ = std::fs::remove_file(&temp);
            log::warn!(
                "cannot write the TLS test certificate to {}: {error}; TLS clients that \
                 check it must wait for the next start",
                path.display()
            );
            format!("(not written to {}: {error})", path.display())
        }
    };
    let key = PrivateKeyDer::Pkcs8(certified.key_pair.serialize_der().into());
    Ok((certified.cert.der().clone(), key, written))
}

/// Driving a rustls session (client or server side) over a glommio stream, for the
/// node's own request/response exchanges: a broker's registrations with a namesrv
/// (RocketMQ's `tls.enable` for its clients) and the metrics endpoint.
pub mod session {
    use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use rustls::{ConnectionCommon, SideData};

    /// Sends what the session has to send.
    pub async fn flush<D: SideData>(
        stream: &mut (impl AsyncWrite + Unpin),
        session: &mut ConnectionCommon<D>,
    ) -> Result<(), String> {
        let mut out = Vec::new();
        while session.wants_write() {
            session
                .write_tls(&mut out)
                .map_err(|e| format!("TLS: {e}"))?;
        }
        if !out.is_empty() {
            stream.write_all(&out).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Hands received bytes to the session and appends the plaintext they carry to `into`.
    pub fn feed<D: SideData>(
        session: &mut ConnectionCommon<D>,
        mut received: &[u8],
        into: &mut Vec<u8>,
    ) -> Result<(), String> {
        use std::io::Read;
        while !received.is_empty() {
            session
                .read_tls(&mut received)
                .map_err(|e| format!("TLS: {e}"))?;
            session
                .process_new_packets()
                .map_err(|e| format!("TLS: {e}"))?;
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match session.reader().read(&mut chunk) {
                    Ok(0) => break,
                    Ok(read) => into.extend_from_slice(&chunk[..read]),
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(error) => return Err(format!("TLS: {error}")),
                }
            }
        }
        Ok(())
    }

    /// Completes the handshake of a new session over `stream`.
    pub async fn handshake(
        stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
        session: &mut rustls::ClientConnection,
    ) -> Result<(), String> {
        let mut chunk = vec![0u8; 16 * 1024];
        let mut early = Vec::new();
        while session.is_handshaking() {
            flush(stream, session).await?;
            if !session.is_handshaking() {
                break;
            }
            let read = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if read == 0 {
                return Err("TLS: the server closed the connection during the handshake".into());
            }
            feed(session, &chunk[..read], &mut early)?;
        }
        flush(stream, session).await
    }
}
