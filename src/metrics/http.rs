//! The metrics port: a small HTTP/1.1 server on shard 0 (one request per connection) that
//! answers `GET /metrics` with the shards' latest snapshots, and hands every other request to
//! the web console (`crate::console`: its pages, its JSON API, 404 for the rest). It speaks TLS under the node's TLS mode as the other ports do
//! (the first byte tells a handshake from a request; enforcing refuses plaintext).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use shards::runtime::{self, TcpListener, TcpStream};

use super::MetricsBoard;
use crate::console::Console;
use crate::tls::{TlsMode, TlsServer, TLS_HANDSHAKE_BYTE};

/// The most a request (head and form body) may take.
const REQUEST_HEAD_MAX_BYTES: usize = 16 * 1024;
/// How long one connection may take, request to answer: a console query asks every broker
/// (each answer within `console::QUERY_TIMEOUT_MS`).
const REQUEST_TIMEOUT_MS: u64 = 30_000;

/// Serves the metrics port forever.
pub async fn serve(
    listener: TcpListener,
    board: Arc<MetricsBoard>,
    tls: Option<Arc<TlsServer>>,
    console: Rc<Console>,
) {
    let board = Rc::new(board);
    let mut acceptor = listener.acceptor();
    let gate = crate::server::PortGate::new("metrics", crate::limits::METRICS_CONNECTIONS_MAX);
    loop {
        let Ok(stream) = acceptor.accept().await else {
            runtime::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let stream = runtime::stream_of(stream);
        // Refused: closed here, when the stream goes.
        let Some(ticket) = gate.admit(stream.peer_addr().ok()) else {
            continue;
        };
        let (board, tls, console) = (board.clone(), tls.clone(), console.clone());
        runtime::spawn_detached(async move {
            let _ticket = ticket;
            let deadline = Duration::from_millis(REQUEST_TIMEOUT_MS);
            let served = answer(stream, &board, &console, tls.as_deref());
            let _ = runtime::timeout(deadline, served).await;
        });
    }
}

/// The response to one request.
async fn respond(request: &[u8], board: &MetricsBoard, console: &Console) -> Vec<u8> {
    let line = request.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let answer = match (method, path) {
        ("GET", "/metrics") => crate::console::Answer {
            status: "200 OK",
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: super::render(&board.snapshots()).into_bytes(),
        },
        _ => {
            let body = head_end(request).map_or(&[][..], |end| &request[end..]);
            console.respond(method, path, query, body).await
        }
    };
    let mut response = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        answer.status,
        answer.content_type,
        answer.body.len()
    )
    .into_bytes();
    response.extend_from_slice(&answer.body);
    response
}

/// Where the head ends (the body starts), once it has.
fn head_end(received: &[u8]) -> Option<usize> {
    let crlf = received
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4);
    crlf.or_else(|| {
        received
            .windows(2)
            .position(|w| w == b"\n\n")
            .map(|at| at + 2)
    })
}

/// Whether the head and as much body as its Content-Length says have arrived.
fn head_complete(received: &[u8]) -> bool {
    let Some(end) = head_end(received) else {
        return false;
    };
    let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    received.len() >= end + length
}

async fn answer(
    mut stream: TcpStream,
    board: &MetricsBoard,
    console: &Console,
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
            answer_tls(stream, board, console, tls, first, &mut chunk).await
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
            let response = respond(&head, board, console).await;
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
    console: &Console,
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
    let response = respond(&head, board, console).await;
    std::io::Write::write_all(&mut session.writer(), &response).map_err(|e| e.to_string())?;
    session.send_close_notify();
    flush(&mut stream, &mut session).await?;
    stream.close().await.map_err(|e| e.to_string())
}
