//! Protocol errors answered as OpenAI error JSON, never with an empty head
//! or a silent close (issue 31).
//!
//! hyper answers a request head it cannot parse by itself: `400 Bad
//! Request` (method, URI, version or a header), `431 Request Header Fields
//! Too Large` (the head outgrew its read buffer), `414 URI Too Long`; each
//! a bare head (`connection: close`, `content-length: 0`, `date`), then it
//! closes. [`ProtocolErrors`] sits between hyper and the socket and writes,
//! in place of exactly such a head, the same status with the error JSON of
//! every other error of the server ([`crate::error::ErrorBody`]); every
//! other byte passes through as it is.
//!
//! Some errors hyper does not answer at all: an HTTP/2 prior-knowledge
//! preface, a parse error it has no status for. When the connection ends
//! with one, [`answer_unanswered`] answers it (505, 400) on the socket the
//! wrapper handed back when hyper dropped it, but only if the client got
//! nothing for the bytes it sent last. A header-read timeout is answered
//! (408) only on a connection that has had a partial head and no answer
//! yet; on a keep-alive connection after a response it closes silently as
//! before, since a pooled client would read a late 408 as the answer to its
//! next request. After an answered protocol error the socket is drained
//! for a moment before it closes ([`LINGER`]), so that the client's unread
//! bytes do not turn the close into a reset that destroys the answer.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::error::{ErrorBody, ErrorDetail};

/// After an answered protocol error: how long the unread rest of the
/// request is read and dropped before the socket closes, and at most how
/// many bytes.
pub const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 16 << 20;

/// Longer than any head hyper writes for a parse error ("HTTP/1.1 431 ...",
/// `connection`, `content-length`, `date`: about 130 bytes); longer writes
/// are not looked at.
const MAX_AUTOMATIC_HEAD: usize = 256;

/// What went over a connection, as far as answering an error goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Request bytes came in after the last byte went out: the client
    /// waits for an answer to them.
    pub owed: bool,
    /// Some byte went out on this connection.
    pub wrote: bool,
    /// The status of hyper's automatic error head that was replaced.
    pub replaced: Option<u16>,
}

/// The socket and what went over it, once hyper has dropped the wrapper.
#[derive(Debug)]
pub struct Handback<S = TcpStream> {
    pub stream: S,
    pub seen: Seen,
}

/// Where a dropped [`ProtocolErrors`] leaves its socket.
#[derive(Debug)]
pub struct HandbackSlot<S = TcpStream>(Arc<Mutex<Option<Handback<S>>>>);

impl<S> HandbackSlot<S> {
    /// The socket, once the wrapper was dropped (`None` before).
    pub fn take(&self) -> Option<Handback<S>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A replacement being written in place of an automatic head.
#[derive(Debug)]
struct Replacement {
    bytes: Vec<u8>,
    written: usize,
    /// The length of hyper's head, reported once `bytes` are all out.
    reported: usize,
    status: u16,
}

/// The IO between hyper and the accepted socket (module docs).
#[derive(Debug)]
pub struct ProtocolErrors<S = TcpStream> {
    /// `Some` until dropped.
    stream: Option<S>,
    seen: Seen,
    pending: Option<Replacement>,
    slot: Arc<Mutex<Option<Handback<S>>>>,
}

impl<S> ProtocolErrors<S> {
    pub fn new(stream: S) -> (Self, HandbackSlot<S>) {
        let slot = Arc::new(Mutex::new(None));
        (Self { stream: Some(stream), seen: Seen::default(), pending: None, slot: slot.clone() }, HandbackSlot(slot))
    }

    fn stream(&mut self) -> &mut S {
        self.stream.as_mut().expect("the stream is there until drop")
    }
}

impl<S> Drop for ProtocolErrors<S> {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(Handback { stream, seen: self.seen });
        }
    }
}

impl<S: AsyncWrite + Unpin> ProtocolErrors<S> {
    /// Starts a replacement if `head` is hyper's automatic error head.
    fn check(&mut self, head: &[u8]) {
        if self.pending.is_none() && maybe_automatic(head) {
            if let Some((status, bytes)) = replacement(head) {
                tracing::debug!(status, "answering a protocol error with error JSON");
                self.pending = Some(Replacement { bytes, written: 0, reported: head.len(), status });
            }
        }
    }

    /// Writes the pending replacement on; `Ready(Ok(n))` with hyper's head
    /// length (at most `limit`) once all of it is out.
    fn poll_replacement(&mut self, cx: &mut Context<'_>, limit: usize) -> Poll<io::Result<usize>> {
        let Self { stream, seen, pending, .. } = self;
        let (stream, p) = (stream.as_mut().expect("the stream is there until drop"), pending.as_mut().expect("a replacement is pending"));
        while p.written < p.bytes.len() {
            let n = ready!(Pin::new(&mut *stream).poll_write(cx, &p.bytes[p.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            p.written += n;
            seen.owed = false;
            seen.wrote = true;
        }
        seen.replaced = Some(p.status);
        let reported = p.reported.min(limit);
        *pending = None;
        Poll::Ready(Ok(reported))
    }

    fn note_written(&mut self, n: usize) {
        if n > 0 {
            self.seen.owed = false;
            self.seen.wrote = true;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ProtocolErrors<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(this.stream()).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.seen.owed = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ProtocolErrors<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(buf);
        if this.pending.is_some() {
            return this.poll_replacement(cx, buf.len());
        }
        let n = ready!(Pin::new(this.stream()).poll_write(cx, buf))?;
        this.note_written(n);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total <= MAX_AUTOMATIC_HEAD {
            let mut flat = [0u8; MAX_AUTOMATIC_HEAD];
            let mut n = 0;
            for b in bufs {
                flat[n..n + b.len()].copy_from_slice(b);
                n += b.len();
            }
            this.check(&flat[..n]);
        }
        if this.pending.is_some() {
            return this.poll_replacement(cx, total);
        }
        let n = ready!(Pin::new(this.stream()).poll_write_vectored(cx, bufs))?;
        this.note_written(n);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().stream()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().stream()).poll_shutdown(cx)
    }
}

/// A cheap first look: could `buf` be an automatic error head?
fn maybe_automatic(buf: &[u8]) -> bool {
    buf.len() <= MAX_AUTOMATIC_HEAD && buf.starts_with(b"HTTP/1.") && matches!(buf.get(8..13), Some(b" 400 " | b" 414 " | b" 431 "))
}

/// hyper's automatic head for a parse error: exactly one complete head,
/// status 400, 414 or 431 with its canonical reason, and no headers but
/// `content-length: 0`, `date` and, on HTTP/1.1, `connection: close`
/// (hyper 1.12 adds it as the connection will close). `(status, the
/// replacement)` for it.
fn replacement(head: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut headers = [httparse::EMPTY_HEADER; 4];
    let mut parsed = httparse::Response::new(&mut headers);
    if parsed.parse(head) != Ok(httparse::Status::Complete(head.len())) {
        return None;
    }
    let status = StatusCode::from_u16(parsed.code?).ok()?;
    let (message, code) = match status {
        StatusCode::BAD_REQUEST => (MALFORMED, "malformed_request"),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => {
            ("the request line and headers are larger than this server accepts", "request_header_fields_too_large")
        }
        StatusCode::URI_TOO_LONG => ("the request URI is longer than this server accepts", "uri_too_long"),
        _ => return None,
    };
    if parsed.reason != status.canonical_reason() {
        return None;
    }
    let (mut date, mut zero_length, mut others) = (None, false, 0);
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("date") && date.is_none() {
            date = std::str::from_utf8(h.value).ok();
        } else if h.name.eq_ignore_ascii_case("content-length") && h.value == b"0" && !zero_length {
            zero_length = true;
        } else if !(h.name.eq_ignore_ascii_case("connection") && h.value.eq_ignore_ascii_case(b"close")) {
            others += 1;
        }
    }
    if others > 0 {
        return None;
    }
    let date = date.filter(|_| zero_length)?;
    Some((status.as_u16(), error_reply(parsed.version?, status, date, message, code)))
}

const MALFORMED: &str = "the request is not valid HTTP/1.1: malformed request line, method, URI, version or header";

/// A whole response: `status` with OpenAI's error JSON, and `connection: close`.
fn error_reply(version: u8, status: StatusCode, date: &str, message: &str, code: &str) -> Vec<u8> {
    let body = ErrorBody {
        error: ErrorDetail { message: message.to_string(), kind: "invalid_request_error".into(), param: None, code: Some(code.into()) },
    };
    let body = serde_json::to_vec(&body).expect("error JSON serializes");
    let mut out = format!(
        "HTTP/1.{version} {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\ndate: {date}\r\n\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// How a connection that hyper left unanswered ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// An HTTP/2 prior-knowledge preface on the HTTP/1 server.
    Http2Preface,
    /// Another parse error.
    Parse,
    /// `--header-read-timeout-s` passed while waiting for a head.
    HeaderTimeout,
    /// Anything else: a client gone, an IO error.
    Other,
}

impl Ending {
    /// The hyper error in `err`'s chain, classified.
    pub fn of(err: &(dyn std::error::Error + 'static)) -> Self {
        let mut cur = Some(err);
        while let Some(e) = cur {
            if let Some(h) = e.downcast_ref::<hyper::Error>() {
                return if h.is_parse_version_h2() {
                    Ending::Http2Preface
                } else if h.is_parse() {
                    Ending::Parse
                } else if h.is_timeout() {
                    Ending::HeaderTimeout
                } else {
                    Ending::Other
                };
            }
            cur = e.source();
        }
        Ending::Other
    }
}

/// The answer owed after a connection ended as `ending` with `seen`, if any.
fn unanswered_reply(ending: Ending, seen: Seen, header_timeout: Duration) -> Option<Vec<u8>> {
    if !seen.owed {
        return None;
    }
    let date = httpdate::fmt_http_date(SystemTime::now());
    let (status, message, code) = match ending {
        Ending::Http2Preface => (
            StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            "HTTP/2 prior knowledge is not supported; use HTTP/1.1".to_string(),
            "http_version_not_supported",
        ),
        Ending::Parse => (StatusCode::BAD_REQUEST, MALFORMED.to_string(), "malformed_request"),
        // Only a first request: on a connection that had an answer, the
        // bytes "owed" may be the tail of a body drained after it.
        Ending::HeaderTimeout if !seen.wrote => (
            StatusCode::REQUEST_TIMEOUT,
            format!("the request's headers did not arrive within {} s (--header-read-timeout-s)", header_timeout.as_secs_f64()),
            "request_header_timeout",
        ),
        Ending::HeaderTimeout | Ending::Other => return None,
    };
    Some(error_reply(1, status, &date, &message, code))
}

/// After a connection ended as `ending` ([`Ending::of`] its error):
/// answers what hyper left unanswered (module docs), and drains the socket
/// for [`LINGER`] when the client got an error answer, from hyper
/// (replaced) or from here.
pub async fn answer_unanswered(ending: Ending, handback: Option<Handback>, header_timeout: Duration) {
    let Some(Handback { stream, seen }) = handback else { return };
    let reply = unanswered_reply(ending, seen, header_timeout);
    if reply.is_none() && seen.replaced.is_none() {
        return;
    }
    if let Some(reply) = reply {
        tracing::debug!(?ending, "answering an unanswered protocol error with error JSON");
        if write_all(&stream, &reply).await.is_err() {
            return;
        }
    }
    linger(stream).await;
}

async fn write_all(stream: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Closes the write side, then reads and drops what the client still sends,
/// until it closes, [`LINGER`] passes or [`LINGER_BYTES`] came.
async fn linger(mut stream: TcpStream) {
    let _ = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx)).await;
    let drain = async {
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0;
        while total < LINGER_BYTES {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut buf) {
                Ok(0) => return,
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

#[cfg(test)]
mod tests;
