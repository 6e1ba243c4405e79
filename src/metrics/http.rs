//! The metrics port: a small HTTP/1.1 server on shard 0 (one request per connection) that
//! answers `GET /metrics` with the shards' latest snapshots, and anything else with 404 (or
//! 405 for other methods). It speaks TLS under the node's TLS mode as the other ports do
//! (the first byte tells a handshake from a request; enforcing refuses plaintext).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use shards::runtime::{self, TcpListener, TcpStream};

use super::MetricsBoard;
use crate::tls::{TlsMode, TlsServer, TLS_HANDSHAKE_BYTE};

/// The most a request head may take, and how long a client has to send it.
const REQUEST_HEAD_MAX_BYTES: usize = 16 * 1024;
const REQUEST_TIMEOUT_MS: u64 = 5_000;

/// Serves the metrics port forever.
pub async fn serve(listener: TcpListener, board: Arc<MetricsBoard>, tls: Option<Arc<TlsServer>>) {
    let board = Rc::new(board);
    loop {
        let Ok(stream) = listener.accept().await else {
            runtime::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (board, tls) = (board.clone(), tls.clone());
        runtime::spawn_detached(async move {
            let deadline = Duration::from_millis(REQUEST_TIMEOUT_MS);
            let _ = runtime::timeout(deadline, answer(stream, &board, tls.as_deref())).await;
        });
    }
}

/// The response to one request head.
fn respond(head: &[u8], board: &MetricsBoard) -> Vec<u8> {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            super::render(&board.snapshots()),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET is served\n".to_string(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(body.as_bytes());
    response
}

fn head_complete(received: &[u8]) -> bool {
    received.windows(4).any(|w| w == b"\r\n\r\n") || received.windows(2).any(|w| w == b"\n\n")
}

async fn answer(
    mut stream: TcpStream,
    board: &MetricsBoard,
    tls: Option<&TlsServer>,
) -> Result<(), String> {
    let mut chunk = vec![0u8; 4096];
    let read = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
    if read == 0 {
        return Ok(());
    }
    let first = chunk[..read].to_vec();
    match tls {
        Some(tls) if first[0] == TLS_HANDSHAKE_BYTE => {
            answer_tls(stream, board, tls, first, &mut chunk).await
        }
        Some(tls) if tls.mode == TlsMode::Enforcing => Ok(()),
        _ => {
            let mut head = first;
            while !head_complete(&head) && head.len() < REQUEST_HEAD_MAX_BYTES {
                let read = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
                if read == 0 {
                    return Ok(());
                }
                head.extend_from_slice(&chunk[..read]);
            }
            let response = respond(&head, board);
            stream
                .write_all(&response)
                .await
                .map_err(|e| e.to_string())?;
            stream.close().await.map_err(|e| e.to_string())
        }
    }
}

async fn answer_tls(
    mut stream: TcpStream,
    board: &MetricsBoard,
    tls: &TlsServer,
    first: Vec<u8>,
    chunk: &mut [u8],
) -> Result<(), String> {
    use crate::tls::session::{feed, flush};
    let mut session =
        rustls::ServerConnection::new(tls.config.clone()).map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    feed(&mut session, &first, &mut head)?;
    loop {
        flush(&mut stream, &mut session).await?;
        if head_complete(&head) || head.len() >= REQUEST_HEAD_MAX_BYTES {
            break;
        }
        let read = stream.read(chunk).await.map_err(|e| e.to_string())?;
        if read == 0 {
            return Ok(());
        }
        feed(&mut session, &chunk[..read], &mut head)?;
    }
    let response = respond(&head, board);
    std::io::Write::write_all(&mut session.writer(), &response).map_err(|e| e.to_string())?;
    session.send_close_notify();
    flush(&mut stream, &mut session).await?;
    stream.close().await.map_err(|e| e.to_string())
}
