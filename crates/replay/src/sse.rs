//! Server-sent events: bytes in, each event's `data` out.

#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds bytes; returns the data of every event they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=i).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(self.data.join("\n"));
                    self.data.clear();
                }
            } else if let Some(rest) = line.strip_prefix("data:") {
                self.data.push(rest.strip_prefix(' ').unwrap_or(rest).to_string());
            }
            // Comments (": keep-alive") and other fields (event:, id:) are skipped.
        }
        events
    }

    /// The stream ended: an event still missing its blank line, if any.
    pub fn finish(&mut self) -> Option<String> {
        let mut tail = self.push(b"\n\n");
        tail.pop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_pushes_and_comments_are_skipped() {
        let mut p = SseParser::default();
        assert!(p.push(b": keep-alive\n\nda").is_empty());
        assert_eq!(p.push(b"ta: {\"a\":1}\r\n\r\ndata:[DONE]\n"), vec!["{\"a\":1}"]);
        assert_eq!(p.finish().as_deref(), Some("[DONE]"));
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn multi_line_data_is_joined() {
        let mut p = SseParser::default();
        assert_eq!(p.push(b"data: a\ndata: b\n\n"), vec!["a\nb"]);
    }
}
