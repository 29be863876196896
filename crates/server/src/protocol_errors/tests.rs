//! Tests of [`super::ProtocolErrors`] and the replies it writes.

use super::*;

const DATE: &str = "Mon, 01 Jan 2024 00:00:00 GMT";

fn automatic(status: &str) -> Vec<u8> {
    format!("HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n").into_bytes()
}

/// (status line, headers, body as JSON) of a whole response.
fn split(reply: &[u8]) -> (String, String, serde_json::Value) {
    let text = String::from_utf8(reply.to_vec()).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let (line, headers) = head.split_once("\r\n").unwrap();
    (line.to_string(), headers.to_string(), serde_json::from_str(body).unwrap())
}

#[test]
fn hypers_automatic_heads_are_replaced_by_error_json() {
    for (status, code) in [
        ("400 Bad Request", "malformed_request"),
        ("431 Request Header Fields Too Large", "request_header_fields_too_large"),
        ("414 URI Too Long", "uri_too_long"),
    ] {
        let (num, reply) = replacement(&automatic(status)).expect(status);
        assert_eq!(num.to_string(), &status[..3]);
        let (line, headers, body) = split(&reply);
        assert_eq!(line, format!("HTTP/1.1 {status}"));
        let body_len = reply.len() - reply.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4;
        for h in ["content-type: application/json", &format!("content-length: {body_len}"), "connection: close", &format!("date: {DATE}")] {
            assert!(headers.lines().any(|l| l == h), "{h} missing in {headers}");
        }
        assert_eq!(body["error"]["code"], code);
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["param"].is_null());
        assert!(body["error"]["message"].as_str().unwrap().len() > 10);
    }
    // An HTTP/1.0 head (no connection header there) keeps its version.
    let head = format!("HTTP/1.0 400 Bad Request\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n");
    assert!(split(&replacement(head.as_bytes()).unwrap().1).0.starts_with("HTTP/1.0 400"));
}

#[test]
fn handler_responses_are_not_taken_for_automatic_heads() {
    let json = r#"{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}"#;
    let handler_400 = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\ndate: {DATE}\r\n\r\n{json}",
        json.len()
    );
    let not_these = [
        handler_400.clone(),
        // Its head alone, as a vectored write's first slice would be.
        handler_400[..handler_400.find("\r\n\r\n").unwrap() + 4].to_string(),
        format!("HTTP/1.1 204 No Content\r\ndate: {DATE}\r\n\r\n"),
        format!("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n"),
        // A head and more, or a head cut short.
        format!("{}HTTP/1.1 200 OK\r\n", String::from_utf8(automatic("400 Bad Request")).unwrap()),
        format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: {DATE}\r\n"),
        format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 5\r\ndate: {DATE}\r\n\r\n"),
        format!("HTTP/1.1 400 Oops\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n"),
        format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: {DATE}\r\nx-a: b\r\n\r\n"),
        format!("HTTP/1.1 400 Bad Request\r\nconnection: keep-alive\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n"),
        "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".to_string(),
    ];
    for bytes in not_these {
        assert!(replacement(bytes.as_bytes()).is_none(), "{bytes:?}");
    }
}

/// A socket that takes at most `max` bytes a write and answers every
/// other write `Pending`.
#[derive(Default)]
struct Trickle {
    out: Vec<u8>,
    max: usize,
    stall: bool,
}

impl AsyncRead for Trickle {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.stall = !this.stall;
        if this.stall {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = buf.len().min(this.max);
        this.out.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Writes `slices` (vectored when more than one) until the wrapper
/// reports a length; that length and the polls it took.
fn write_once(w: &mut ProtocolErrors<Trickle>, slices: &[&[u8]]) -> (usize, usize) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let io: Vec<_> = slices.iter().map(|s| io::IoSlice::new(s)).collect();
    for polls in 1..10_000 {
        let r = if slices.len() == 1 {
            Pin::new(&mut *w).poll_write(&mut cx, slices[0])
        } else {
            Pin::new(&mut *w).poll_write_vectored(&mut cx, &io)
        };
        if let Poll::Ready(n) = r {
            return (n.unwrap(), polls);
        }
    }
    panic!("never done");
}

#[test]
fn a_replacement_written_in_pieces_is_finished_before_hyper_hears_of_it() {
    let head = automatic("431 Request Header Fields Too Large");
    let (_, want) = replacement(&head).unwrap();
    let (mut w, slot) = ProtocolErrors::new(Trickle { max: 7, ..Default::default() });
    let (n, polls) = write_once(&mut w, &[&head]);
    assert_eq!(n, head.len(), "hyper's whole head is reported written");
    assert!(polls > want.len() / 7, "{polls} polls: reported before the replacement was out");
    assert_eq!(w.stream.as_ref().unwrap().out, want);
    drop(w);
    let back = slot.take().expect("handed back on drop");
    assert_eq!(back.seen, Seen { owed: false, wrote: true, replaced: Some(431) });
}

#[test]
fn vectored_heads_are_replaced_and_other_writes_pass_through() {
    let head = automatic("400 Bad Request");
    let (_, want) = replacement(&head).unwrap();
    let (mut w, _slot) = ProtocolErrors::new(Trickle { max: 1 << 20, ..Default::default() });
    assert_eq!(write_once(&mut w, &[&head[..10], b"", &head[10..]]).0, head.len());
    assert_eq!(w.stream.as_ref().unwrap().out, want);

    let (mut w, slot) = ProtocolErrors::new(Trickle { max: 5, ..Default::default() });
    let ok = b"HTTP/1.1 204 No Content\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n";
    let mut sent = 0;
    while sent < ok.len() {
        sent += write_once(&mut w, &[&ok[sent..]]).0;
    }
    let body: &[u8] = br#"{"error":{}}"#;
    let handler = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n";
    let mut w2 = ProtocolErrors::new(Trickle { max: 1 << 20, ..Default::default() }).0;
    // (Trickle writes the first slice of a vectored write.)
    assert_eq!(write_once(&mut w2, &[handler, body]).0, handler.len());
    assert_eq!(write_once(&mut w2, &[body]).0, body.len());
    assert_eq!(w2.stream.as_ref().unwrap().out, [&handler[..], body].concat());
    assert_eq!(w.stream.as_ref().unwrap().out, ok);
    drop(w);
    assert_eq!(slot.take().unwrap().seen.replaced, None);
}

#[test]
fn unanswered_errors_are_answered_only_when_the_client_got_nothing() {
    let t = Duration::from_secs(30);
    let owed = Seen { owed: true, ..Default::default() };
    let line = |r: Option<Vec<u8>>| r.map(|r| split(&r).0);
    assert_eq!(line(unanswered_reply(Ending::Http2Preface, owed, t)).as_deref(), Some("HTTP/1.1 505 HTTP Version Not Supported"));
    let (_, _, body) = split(&unanswered_reply(Ending::Http2Preface, owed, t).unwrap());
    assert_eq!(body["error"]["message"], "HTTP/2 prior knowledge is not supported; use HTTP/1.1");
    assert_eq!(line(unanswered_reply(Ending::Parse, owed, t)).as_deref(), Some("HTTP/1.1 400 Bad Request"));
    // A partial first head that timed out: 408.
    let (line408, _, body) = split(&unanswered_reply(Ending::HeaderTimeout, owed, t).unwrap());
    assert_eq!((line408.as_str(), body["error"]["code"].as_str()), ("HTTP/1.1 408 Request Timeout", Some("request_header_timeout")));
    // Idle (nothing owed), after an answer on the connection, or gone: nothing.
    for ending in [Ending::Http2Preface, Ending::Parse, Ending::HeaderTimeout, Ending::Other] {
        assert_eq!(unanswered_reply(ending, Seen::default(), t), None, "{ending:?}");
        assert_eq!(unanswered_reply(ending, Seen { wrote: true, replaced: Some(400), owed: false }, t), None, "{ending:?}");
    }
    assert_eq!(unanswered_reply(Ending::HeaderTimeout, Seen { owed: true, wrote: true, replaced: None }, t), None);
    assert_eq!(unanswered_reply(Ending::Other, owed, t), None);
}

/// Serves a one-route app through `serve_until` until the test ends.
async fn served(header_read_timeout: Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hi" }));
    let limits = crate::shutdown::ConnLimits { max_connections: 16, header_read_timeout };
    let lifecycle = Arc::new(crate::shutdown::Lifecycle::default());
    tokio::spawn(crate::shutdown::serve_until(listener, app, lifecycle, Duration::from_secs(1), limits, std::future::pending()));
    addr
}

/// Sends `request` on a new connection; everything the server sends back until it closes.
async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.expect("closed in time");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn hyper_answers_through_serve_until_come_as_error_json() {
    let addr = served(Duration::from_millis(300)).await;
    let cases: [(&[u8], &str); 5] = [
        (b"G\x00T / HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/1.1 505 HTTP Version Not Supported"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n", "HTTP/1.1 408 Request Timeout"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "HTTP/1.1 200 OK"),
    ];
    for (request, want) in cases {
        let got = exchange(addr, request).await;
        assert!(got.starts_with(want), "{request:?}: {got:?}");
        if !want.ends_with("OK") {
            assert!(got.contains("content-type: application/json"), "{got:?}");
            let body = &got[got.find("\r\n\r\n").unwrap() + 4..];
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert!(v["error"]["message"].is_string(), "{got:?}");
        }
    }
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    assert!(exchange(addr, long_uri.as_bytes()).await.starts_with("HTTP/1.1 414 URI Too Long"));
    let big_head = format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", "x-pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(30_000));
    let got = exchange(addr, big_head.as_bytes()).await;
    assert!(got.starts_with("HTTP/1.1 431 Request Header Fields Too Large"), "{got:?}");
    // An idle connection still closes with nothing.
    assert_eq!(exchange(addr, b"").await, "");
    // A timeout after an answer on a kept-alive connection: closed with nothing more.
    let got = exchange(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HT").await;
    assert_eq!(got.matches("HTTP/1.1").count(), 1, "{got:?}");
}
