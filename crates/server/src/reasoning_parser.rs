//! Qwen3's reasoning: `<think>...</think>` separated from the answer, as
//! vLLM's and SGLang's `qwen3` reasoning parsers do.
//!
//! One streaming parser serves both streamed and whole answers (a whole
//! answer is parsed as a single push), so both always agree.
//!
//! Rules:
//! - The parser starts where the prompt left the assistant turn
//!   ([`ReasoningParser::primed`]): after `<|im_start|>assistant\n` nothing
//!   is decided yet; after a template-opened `<think>` (Qwen3-Thinking-2507
//!   style templates, or a client's prefill) the output is reasoning until
//!   `</think>`; after `<think>\n\n</think>\n\n` (`enable_thinking: false`)
//!   it is all content.
//! - Undecided: leading whitespace then `<think>` opens reasoning; a leading
//!   `</think>` closes an (empty) reasoning; anything else means the answer
//!   has no reasoning, and all of it is content (tags included, as text).
//! - In reasoning, text up to `</think>` is reasoning; an answer cut off
//!   inside it (`max_tokens`) leaves what was generated as reasoning, as
//!   vLLM's current qwen3 parser does (a stream cannot know the future).
//! - Newlines right inside the tags and right after `</think>` are layout,
//!   not text: dropped (Qwen3's chat template strips them too when the turn
//!   is sent back, so a round trip is stable).

/// Opens reasoning.
pub const THINK_START: &str = "<think>";
/// Closes reasoning.
pub const THINK_END: &str = "</think>";

/// What one push produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    fn append(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace seen.
    Undecided,
    /// Right after `<think>`: newlines are dropped.
    ReasoningStart,
    Reasoning,
    /// Right after `</think>`: newlines are dropped.
    ContentStart,
    Content,
}

#[derive(Debug, Clone)]
pub struct ReasoningParser {
    phase: Phase,
    /// Text not yet classified (a possible tag, or trailing newlines that
    /// may precede `</think>`).
    held: String,
}

impl Default for ReasoningParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ReasoningParser {
    pub fn new() -> Self {
        Self { phase: Phase::Undecided, held: String::new() }
    }

    /// A parser positioned after `prefix`, the part of the assistant turn
    /// already in the prompt; also returns what `prefix` itself parsed to.
    pub fn primed(prefix: &str) -> (Self, Split) {
        let mut p = Self::new();
        let split = p.push(prefix);
        (p, split)
    }

    /// True inside a reasoning block.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.phase, Phase::Reasoning | Phase::ReasoningStart)
    }

    /// True once the answer is known to be content from here on.
    pub fn in_content(&self) -> bool {
        matches!(self.phase, Phase::Content | Phase::ContentStart)
    }

    /// Feeds the next piece of text; returns what is decided.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            match self.phase {
                Phase::Undecided => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(THINK_START) {
                        self.held = rest.to_string();
                        self.phase = Phase::ReasoningStart;
                    } else if let Some(rest) = trimmed.strip_prefix(THINK_END) {
                        self.held = rest.to_string();
                        self.phase = Phase::ContentStart;
                    } else if THINK_START.starts_with(trimmed) || THINK_END.starts_with(trimmed) {
                        return out; // only whitespace, or a tag cut short: wait
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::ReasoningStart | Phase::ContentStart => {
                    let rest = self.held.trim_start_matches('\n');
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_string();
                    self.phase = if self.phase == Phase::ReasoningStart { Phase::Reasoning } else { Phase::Content };
                }
                Phase::Reasoning => {
                    if let Some(i) = self.held.find(THINK_END) {
                        out.reasoning.push_str(self.held[..i].trim_end_matches('\n'));
                        self.held = self.held[i + THINK_END.len()..].to_string();
                        self.phase = Phase::ContentStart;
                        continue;
                    }
                    let keep = held_back_len(&self.held, THINK_END);
                    let cut = self.held.len() - keep;
                    out.reasoning.push_str(&self.held[..cut]);
                    self.held.drain(..cut);
                    return out;
                }
                Phase::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// The answer ended: releases what was held, as what it was taken for.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        let mut out = Split::default();
        match self.phase {
            Phase::Reasoning | Phase::ReasoningStart => out.reasoning = held,
            Phase::Undecided | Phase::Content => out.content = held,
            Phase::ContentStart => {}
        }
        out
    }

    /// Parses a whole answer in one go (the non-streaming path uses the
    /// same pushes as a stream; this is for tests and tools).
    pub fn parse_all(prefix: &str, text: &str) -> Split {
        let (mut p, _) = Self::primed(prefix);
        let mut out = p.push(text);
        out.append(p.finish());
        out
    }
}

/// How many trailing bytes of `text` must wait because they might be the
/// start of `tag` (a proper prefix of it), together with the newlines just
/// before them (dropped if the tag follows).
fn held_back_len(text: &str, tag: &str) -> usize {
    let partial = (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&k| text.is_char_boundary(text.len() - k) && tag.starts_with(&text[text.len() - k..]))
        .unwrap_or(0);
    let before = &text[..text.len() - partial];
    partial + (before.len() - before.trim_end_matches('\n').len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one by one and returns the concatenated result.
    fn stream(prefix: &str, pieces: &[&str]) -> Split {
        let (mut p, _) = ReasoningParser::primed(prefix);
        let mut out = Split::default();
        for piece in pieces {
            out.append(p.push(piece));
        }
        out.append(p.finish());
        out
    }

    fn split(reasoning: &str, content: &str) -> Split {
        Split { reasoning: reasoning.into(), content: content.into() }
    }

    #[test]
    fn think_block_is_reasoning_and_the_rest_content() {
        let text = "<think>\nThe user greets me.\n</think>\n\nHello!";
        assert_eq!(ReasoningParser::parse_all("", text), split("The user greets me.", "Hello!"));
    }

    #[test]
    fn answer_without_think_is_all_content() {
        assert_eq!(ReasoningParser::parse_all("", "Hello </think> there"), split("", "Hello </think> there"));
        assert_eq!(ReasoningParser::parse_all("", "  \n"), split("", "  \n"));
        assert_eq!(ReasoningParser::parse_all("", ""), split("", ""));
    }

    #[test]
    fn template_opened_think_makes_output_reasoning_until_the_end_tag() {
        // Qwen3-Thinking-2507 style: the prompt ends with "<think>\n".
        let out = ReasoningParser::parse_all("<think>\n", "plan the answer\n</think>\n\nDone.");
        assert_eq!(out, split("plan the answer", "Done."));
    }

    #[test]
    fn thinking_disabled_prompt_makes_everything_content() {
        let prefix = "<think>\n\n</think>\n\n";
        let (p, echoed) = ReasoningParser::primed(prefix);
        assert!(p.in_content());
        assert_eq!(echoed, split("", ""));
        assert_eq!(ReasoningParser::parse_all(prefix, "<think>x</think>y"), split("", "<think>x</think>y"));
    }

    #[test]
    fn answer_cut_off_inside_reasoning_keeps_it_as_reasoning() {
        assert_eq!(ReasoningParser::parse_all("", "<think>\nstill thinking\n"), split("still thinking\n", ""));
        assert_eq!(ReasoningParser::parse_all("", "<think>a</thi"), split("a</thi", ""));
    }

    #[test]
    fn leading_end_tag_closes_an_empty_reasoning() {
        assert_eq!(ReasoningParser::parse_all("", "</think>\n\nAnswer"), split("", "Answer"));
    }

    #[test]
    fn tags_split_across_pushes_are_recognised() {
        let text = "<think>\nabc\n</think>\n\nxyz";
        // Every way of cutting the text in two, and char by char.
        for cut in 0..=text.len() {
            assert_eq!(stream("", &[&text[..cut], &text[cut..]]), split("abc", "xyz"), "cut at {cut}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(stream("", &pieces), split("abc", "xyz"));
    }

    #[test]
    fn reasoning_streams_before_the_end_tag_arrives() {
        let mut p = ReasoningParser::new();
        assert_eq!(p.push("<think>"), split("", ""));
        assert_eq!(p.push("\nfirst"), split("first", ""));
        assert_eq!(p.push(" second\n"), split(" second", ""));
        assert_eq!(p.push("</"), split("", ""));
        assert_eq!(p.push("think>\n\nok"), split("", "ok"));
        assert_eq!(p.finish(), split("", ""));
    }

    #[test]
    fn multibyte_text_next_to_tags_is_kept_whole() {
        let text = "<think>思考</think>答案";
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            assert_eq!(stream("", &[&text[..cut], &text[cut..]]), split("思考", "答案"));
        }
    }
}
