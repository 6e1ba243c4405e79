//! TLS towards brokers and name servers (rustls on tokio), as RocketMQ's `tls.enable` /
//! `useTLS` clients do: with a CA file the server's certificate is verified against it (and
//! must name the address connected to); without one any certificate is taken, as RocketMQ's
//! clients do with no `tls.client.trustCertPath` (a broker in TLS test mode has a self-signed
//! one). An optional client certificate answers brokers that require one.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// How a client speaks TLS.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM CA certificates the server's certificate must chain to; `None`: any certificate.
    pub trust_cert_path: Option<PathBuf>,
    /// PEM certificate chain and key to present when the server asks for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl TlsOptions {
    /// The rustls configuration these options describe.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &self.trust_cert_path {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certs(path)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                }
                builder.with_root_certificates(roots)
            }
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
        };
        let config = match &self.client_cert {
            Some((cert_path, key_path)) => {
                let key = PrivateKeyDer::from_pem_file(key_path)
                    .map_err(|e| format!("{}: {e}", key_path.display()))?;
                builder
                    .with_client_auth_cert(read_certs(cert_path)?, key)
                    .map_err(|e| format!("client certificate: {e}"))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }
}

fn read_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The server name to verify for `addr` ("host:port"): an IP address or a DNS name.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))
}

/// Takes any server certificate; the handshake's signatures are still checked, so the
/// session is encrypted to whoever holds the certificate's key.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
