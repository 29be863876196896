//! A minimal HTTP/1.1 client over tokio's `TcpStream`: one connection per
//! request (`Connection: close`), request bodies with `Content-Length`,
//! response bodies chunked, sized or closed-delimited, read incrementally
//! so streamed tokens are timed when they arrive. Plain http only: a
//! benchmark client talks to a server on its own network, and this keeps
//! the crate free of TLS and of an HTTP client's compile cost.

use std::fmt;
use std::str::FromStr;

use tokio::net::TcpStream;

use crate::error::{ReplayError, Result};

/// `http://host:port[/prefix]`; a trailing `/v1` is dropped so that both
/// `http://h:8000` and `http://h:8000/v1` name the same server.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseUrl {
    pub host: String,
    pub port: u16,
    pub prefix: String,
}

impl FromStr for BaseUrl {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let rest = if let Some(r) = s.strip_prefix("http://") {
            r
        } else if s.starts_with("https://") {
            return Err(format!("{s}: https is not supported; point kvc-replay at the server's plain-http port"));
        } else {
            s
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !p.contains(']') => {
                (h.trim_matches(['[', ']']).to_string(), p.parse::<u16>().map_err(|_| format!("{s}: bad port {p:?}"))?)
            }
            _ => (authority.trim_matches(['[', ']']).to_string(), 80),
        };
        if host.is_empty() {
            return Err(format!("{s}: no host"));
        }
        let mut prefix = path.trim_end_matches('/').to_string();
        if prefix.ends_with("/v1") {
            prefix.truncate(prefix.len() - 3);
        }
        Ok(BaseUrl { host, port, prefix })
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}:{}{}", self.host, self.port, self.prefix)
    }
}

pub struct Response {
    pub status: u16,
    /// Names lowercased.
    pub headers: Vec<(String, String)>,
    conn: Conn,
    body: Body,
}

enum Body {
    Length(usize),
    Chunked(ChunkState),
    UntilEof,
}

#[derive(Clone, Copy)]
enum ChunkState {
    Size,
    Data(usize),
    DataEnd,
    Done,
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Conn {
    /// Reads more bytes into `buf`; returns how many (0 at end of stream).
    async fn fill(&mut self) -> Result<usize> {
        if self.eof {
            return Ok(0);
        }
        let mut tmp = [0u8; 16 * 1024];
        loop {
            self.stream.readable().await.map_err(|e| ReplayError::Http(format!("read: {e}")))?;
            match self.stream.try_read(&mut tmp) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(0);
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(ReplayError::Http(format!("read: {e}"))),
            }
        }
    }

    async fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            self.stream.writable().await.map_err(|e| ReplayError::Http(format!("write: {e}")))?;
            match self.stream.try_write(data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(ReplayError::Http(format!("write: {e}"))),
            }
        }
        Ok(())
    }

    /// Bytes up to and including the next CRLF, without it.
    async fn line(&mut self) -> Result<Vec<u8>> {
        loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                let line = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            if self.fill().await? == 0 {
                return Err(ReplayError::Http("connection closed inside a chunked body".into()));
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Sends one request; the response's head is read, its body is not.
pub async fn send(url: &BaseUrl, method: &str, path: &str, headers: &[(&str, String)], body: Option<&[u8]>) -> Result<Response> {
    let stream = TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| ReplayError::Http(format!("connect to {}:{}: {e}", url.host, url.port)))?;
    stream.set_nodelay(true).ok();
    let mut conn = Conn { stream, buf: Vec::new(), eof: false };
    let mut head = format!(
        "{method} {}{path} HTTP/1.1\r\nhost: {}:{}\r\nuser-agent: kvc-replay\r\nconnection: close\r\n",
        url.prefix, url.host, url.port
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!("content-length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).await?;
    if let Some(b) = body {
        conn.write_all(b).await?;
    }

    let end = loop {
        if let Some(i) = find(&conn.buf, b"\r\n\r\n") {
            break i;
        }
        if conn.fill().await? == 0 {
            return Err(ReplayError::Http("connection closed before a response".into()));
        }
    };
    let head_text = String::from_utf8_lossy(&conn.buf[..end]).into_owned();
    conn.buf.drain(..end + 4);
    let mut lines = head_text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or_else(|| ReplayError::Http(format!("not an HTTP/1.1 response: {status_line:?}")))?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let body = if method == "HEAD" || status == 204 || status == 304 {
        Body::Length(0)
    } else if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        Body::Chunked(ChunkState::Size)
    } else if let Some(n) = get("content-length").and_then(|v| v.parse().ok()) {
        Body::Length(n)
    } else {
        Body::UntilEof
    };
    Ok(Response { status, headers, conn, body })
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The next piece of the body as it arrives; `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Vec<u8>>> {
        loop {
            match self.body {
                Body::Length(0) => return Ok(None),
                Body::Length(n) => {
                    if self.conn.buf.is_empty() && self.conn.fill().await? == 0 {
                        return Err(ReplayError::Http(format!("connection closed with {n} body bytes missing")));
                    }
                    let take = n.min(self.conn.buf.len());
                    self.body = Body::Length(n - take);
                    return Ok(Some(self.conn.buf.drain(..take).collect()));
                }
                Body::UntilEof => {
                    if self.conn.buf.is_empty() && self.conn.fill().await? == 0 {
                        return Ok(None);
                    }
                    return Ok(Some(std::mem::take(&mut self.conn.buf)));
                }
                Body::Chunked(ChunkState::Done) => return Ok(None),
                Body::Chunked(ChunkState::Size) => {
                    let line = self.conn.line().await?;
                    let text = String::from_utf8_lossy(&line);
                    let hex = text.split(';').next().unwrap_or("").trim();
                    let size = usize::from_str_radix(hex, 16).map_err(|_| ReplayError::Http(format!("bad chunk size line {text:?}")))?;
                    if size == 0 {
                        // Trailers, up to an empty line.
                        while !self.conn.line().await?.is_empty() {}
                        self.body = Body::Chunked(ChunkState::Done);
                    } else {
                        self.body = Body::Chunked(ChunkState::Data(size));
                    }
                }
                Body::Chunked(ChunkState::Data(n)) => {
                    if self.conn.buf.is_empty() && self.conn.fill().await? == 0 {
                        return Err(ReplayError::Http("connection closed inside a chunk".into()));
                    }
                    let take = n.min(self.conn.buf.len());
                    self.body = Body::Chunked(if take == n { ChunkState::DataEnd } else { ChunkState::Data(n - take) });
                    return Ok(Some(self.conn.buf.drain(..take).collect()));
                }
                Body::Chunked(ChunkState::DataEnd) => {
                    let rest = self.conn.line().await?;
                    if !rest.is_empty() {
                        return Err(ReplayError::Http("chunk not followed by CRLF".into()));
                    }
                    self.body = Body::Chunked(ChunkState::Size);
                }
            }
        }
    }

    /// The whole body.
    pub async fn bytes(mut self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(c) = self.chunk().await? {
            out.extend_from_slice(&c);
        }
        Ok(out)
    }
}

/// `GET path`: status and body.
pub async fn get(url: &BaseUrl, path: &str, headers: &[(&str, String)]) -> Result<(u16, Vec<u8>)> {
    let resp = send(url, "GET", path, headers, None).await?;
    let status = resp.status;
    Ok((status, resp.bytes().await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_accept_a_v1_suffix_and_refuse_https() {
        let u: BaseUrl = "http://127.0.0.1:8000/v1/".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port, u.prefix.as_str()), ("127.0.0.1", 8000, ""));
        let u: BaseUrl = "localhost:9/api/v1".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port, u.prefix.as_str()), ("localhost", 9, "/api"));
        assert_eq!("http://h".parse::<BaseUrl>().unwrap().port, 80);
        assert!("https://h:1".parse::<BaseUrl>().unwrap_err().contains("https"));
    }

    /// A raw server answering one connection with `reply`.
    async fn serve_once(reply: &'static [u8]) -> BaseUrl {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut c = Conn { stream: s, buf: vec![], eof: false };
            while find(&c.buf, b"\r\n\r\n").is_none() {
                c.fill().await.unwrap();
            }
            for piece in reply.chunks(7) {
                c.write_all(piece).await.unwrap();
            }
        });
        format!("http://127.0.0.1:{port}").parse().unwrap()
    }

    #[tokio::test]
    async fn chunked_bodies_are_decoded_across_split_reads() {
        let url = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kvc-Path: local\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n",
        )
        .await;
        let resp = send(&url, "POST", "/x", &[], Some(b"{}")).await.unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("x-kvc-path"), Some("local"));
        assert_eq!(resp.bytes().await.unwrap(), b"hello, world");
    }

    #[tokio::test]
    async fn sized_and_close_delimited_bodies_are_read_whole() {
        let url = serve_once(b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nabcEXTRA").await;
        assert_eq!(get(&url, "/", &[]).await.unwrap(), (404, b"abc".to_vec()));
        let url = serve_once(b"HTTP/1.1 200 OK\r\n\r\nuntil the end").await;
        assert_eq!(get(&url, "/", &[]).await.unwrap().1, b"until the end");
    }
}
