//! Stop strings: finds them across token boundaries and holds back text
//! that might be the start of one.
//!
//! Semantics:
//! * the first stop string to *complete* in the text wins (ties: the one
//!   that starts earlier, i.e. the longer). This is what a scan of the text
//!   character by character would see, so the result does not depend on how
//!   the text was cut into pushes;
//! * on a match the text before it is emitted, the stop string and anything
//!   after it are dropped, and later pushes emit nothing;
//! * otherwise the longest suffix of the text that is a proper prefix of some
//!   stop string is held back (cut at char boundaries), the rest emitted;
//! * empty stop strings are ignored; with no stop strings text passes
//!   straight through and nothing is held;
//! * text pushed early ([`StopMatcher::push_early`], the tokens before
//!   `min_tokens`) cannot complete a stop string, but one may start in it
//!   and complete in a later push (vLLM's rule).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to emit now.
    pub emit: String,
    /// The stop string that matched; generation ends, and the text from the
    /// match on is dropped.
    pub matched: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    /// Longest stop string, in bytes.
    max_len: usize,
    /// A stop string matched; everything after is dropped.
    finished: bool,
    /// Bytes at the start of `held` pushed early: a match must end after them.
    early: usize,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let mut stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let mut seen = std::collections::HashSet::new();
        stops.retain(|s| seen.insert(s.clone()));
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        Self { stops, held: String::new(), max_len, finished: false, early: 0 }
    }

    /// True once a stop string has matched.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Text currently held back.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Feed the next text delta.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.feed(text, true)
    }

    /// Feed a delta that may not complete a stop string (it never matches).
    pub fn push_early(&mut self, text: &str) -> StopOutcome {
        self.feed(text, false)
    }

    fn feed(&mut self, text: &str, may_match: bool) -> StopOutcome {
        if self.finished {
            return StopOutcome { emit: String::new(), matched: None };
        }
        if self.stops.is_empty() {
            return StopOutcome { emit: text.to_string(), matched: None };
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        let early = if may_match { self.early } else { buf.len() };

        // The match that completes first (after the early text); ties go
        // to the earlier start.
        let best = self
            .stops
            .iter()
            .filter(|_| may_match)
            .filter_map(|s| find_ending_after(&buf, s, early).map(|start| (start + s.len(), start, s)))
            .min_by_key(|&(end, start, _)| (end, start));
        if let Some((_, start, stop)) = best {
            let matched = Some(stop.clone());
            buf.truncate(start);
            self.finished = true;
            return StopOutcome { emit: buf, matched };
        }

        // Hold back the longest suffix that some stop string starts with.
        let min_start = buf.len().saturating_sub(self.max_len - 1);
        let hold_from = buf
            .char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i >= min_start)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&buf[i..])))
            .unwrap_or(buf.len());
        self.held = buf.split_off(hold_from);
        self.early = early.saturating_sub(hold_from);
        StopOutcome { emit: buf, matched: None }
    }

    /// Generation ended without a stop string: release what was held back.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Where the first occurrence of `stop` (not empty) that ends after byte
/// `after` of `buf` starts.
fn find_ending_after(buf: &str, stop: &str, after: usize) -> Option<usize> {
    let mut from = after.saturating_sub(stop.len() - 1);
    while !buf.is_char_boundary(from) {
        from += 1;
    }
    buf[from..].find(stop).map(|i| from + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    /// Pushes each piece; returns (all emitted text, matched stop, flush).
    fn run(m: &mut StopMatcher, pieces: &[&str]) -> (String, Option<String>) {
        let mut out = String::new();
        let mut matched = None;
        for p in pieces {
            let o = m.push(p);
            out.push_str(&o.emit);
            if o.matched.is_some() {
                assert!(matched.is_none(), "matched twice");
                matched = o.matched;
            }
        }
        if matched.is_none() {
            out.push_str(&m.flush());
        }
        (out, matched)
    }

    fn chars(s: &str) -> Vec<String> {
        s.chars().map(String::from).collect()
    }

    #[test]
    fn stop_split_char_by_char_is_found_and_text_before_emitted() {
        let mut m = matcher(&["STOP here"]);
        let pieces = chars("some text STOP here and more");
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (out, matched) = run(&mut m, &refs);
        assert_eq!(out, "some text ");
        assert_eq!(matched.as_deref(), Some("STOP here"));
        assert!(m.is_finished());
        assert_eq!(m.push("ignored").emit, "");
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn held_text_never_includes_a_possible_stop_prefix_too_early() {
        let mut m = matcher(&["</end>"]);
        let o = m.push("abc</e");
        assert_eq!(o, StopOutcome { emit: "abc".into(), matched: None });
        assert_eq!(m.held(), "</e");
        let o = m.push("nd>tail");
        assert_eq!(o, StopOutcome { emit: "".into(), matched: Some("</end>".into()) });
    }

    #[test]
    fn overlapping_stops_earliest_match_in_text_wins() {
        for pieces in [vec!["abc"], vec!["a", "b", "c"], vec!["ab", "c"], vec!["a", "bc"]] {
            let mut m = matcher(&["bc", "ab"]);
            let (out, matched) = run(&mut m, &pieces);
            assert_eq!((out.as_str(), matched.as_deref()), ("", Some("ab")), "{pieces:?}");
        }
        // The stop that completes first wins, however the text is chunked.
        for pieces in [vec!["xabcd"], vec!["x", "a", "b", "c", "d"]] {
            let mut m = matcher(&["abcd", "b"]);
            let (out, matched) = run(&mut m, &pieces);
            assert_eq!((out.as_str(), matched.as_deref()), ("xa", Some("b")), "{pieces:?}");
        }
        // Same end: the longer (earlier-starting) one.
        let mut m = matcher(&["c", "abc"]);
        assert_eq!(m.push("zabcz"), StopOutcome { emit: "z".into(), matched: Some("abc".into()) });
    }

    #[test]
    fn partial_match_that_fails_is_released() {
        let mut m = matcher(&["<|stop|>"]);
        assert_eq!(m.push("x <|st").emit, "x ");
        assert_eq!(m.held(), "<|st");
        let o = m.push("art|> y");
        assert_eq!(o, StopOutcome { emit: "<|start|> y".into(), matched: None });
        assert_eq!(m.held(), "");
        // A failed partial that contains the start of another partial keeps that part.
        let mut m = matcher(&["aab"]);
        assert_eq!(m.push("aa").emit, "");
        assert_eq!(m.push("a").emit, "a");
        assert_eq!(m.held(), "aa");
        assert_eq!(m.push("b"), StopOutcome { emit: "".into(), matched: Some("aab".into()) });
        // Released at the end.
        let mut m = matcher(&["###"]);
        assert_eq!(run(&mut m, &["done ##"]), ("done ##".to_string(), None));
    }

    #[test]
    fn non_ascii_stops_respect_char_boundaries() {
        let mut m = matcher(&["停止！", "🛑"]);
        let text = "好的，我会停一下，然后停止！之后";
        let pieces = chars(text);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(run(&mut m, &refs), ("好的，我会停一下，然后".to_string(), Some("停止！".to_string())));

        let mut m = matcher(&["🛑x"]);
        assert_eq!(m.push("a🛑").emit, "a");
        assert_eq!(m.held(), "🛑");
        assert_eq!(m.push("y").emit, "🛑y");

        // A stop whose first bytes equal the first bytes of another char:
        // "é" (C3 A9) vs "è" (C3 A8); no byte-level partial hold.
        let mut m = matcher(&["éa"]);
        assert_eq!(m.push("è").emit, "è");
        assert_eq!(m.push("ééa"), StopOutcome { emit: "é".into(), matched: Some("éa".into()) });
    }

    #[test]
    fn no_stops_pass_through_without_holding() {
        let mut m = matcher(&[]);
        for p in ["<", "|im", "_end", "|>", "🦀"] {
            assert_eq!(m.push(p), StopOutcome { emit: p.into(), matched: None });
            assert_eq!(m.held(), "");
        }
        assert_eq!(m.flush(), "");
        // Empty stop strings are ignored.
        let mut m = matcher(&["", ""]);
        assert_eq!(m.push("abc"), StopOutcome { emit: "abc".into(), matched: None });
        let mut m = matcher(&["", "z"]);
        assert_eq!(m.push("abc").emit, "abc");
    }

    #[test]
    fn text_pushed_early_cannot_complete_a_stop_but_may_start_one() {
        // A stop wholly inside the early text is not matched, and is emitted.
        let mut m = matcher(&["ab"]);
        assert_eq!(m.push_early("xab"), StopOutcome { emit: "xab".into(), matched: None });
        assert_eq!(m.push("x").emit, "x");
        assert_eq!(m.push("ab"), StopOutcome { emit: "".into(), matched: Some("ab".into()) });
        // One that starts early and completes in a later push matches.
        let mut m = matcher(&["ab"]);
        assert_eq!(m.push_early("xa").emit, "x");
        assert_eq!(m.push("bz"), StopOutcome { emit: "".into(), matched: Some("ab".into()) });
        // A complete short stop held inside another's prefix stays unmatched.
        let mut m = matcher(&["b", "abc"]);
        assert_eq!(m.push_early("ab").emit, "");
        assert_eq!(m.push("x"), StopOutcome { emit: "abx".into(), matched: None });
        // Non-ASCII: "zz" is searched from a char boundary, not from inside "é".
        let mut m = matcher(&["aéz", "zz"]);
        assert_eq!(m.push_early("aé").emit, "");
        assert_eq!(m.push("zz"), StopOutcome { emit: "".into(), matched: Some("aéz".into()) });
    }

    #[test]
    fn concatenation_of_emits_is_the_text_up_to_the_match_for_any_chunking() {
        let text = "alpha beta <END> gamma";
        let stops = ["<END>", "zeta", "ta <X"];
        let expected = "alpha beta ";
        for cut in 1..text.len() {
            let (a, b) = text.split_at(cut);
            let mut m = matcher(&stops);
            assert_eq!(run(&mut m, &[a, b]), (expected.to_string(), Some("<END>".to_string())), "cut {cut}");
        }
    }
}
