//! What every tool-call format shares ([`crate::tool_parser`]'s Hermes
//! blocks, [`crate::tool_parser_qwen3_coder`]'s XML ones): the
//! `<tool_call>` tags, what a parser gives ([`ToolOutput`]), and the stream
//! around the blocks ([`ToolCallStream`]): text passes through as soon as
//! it cannot be the start of a `<tool_call>`; whitespace right before a
//! block, and after the last call at the end of the answer, is layout and
//! dropped; a block is held until the format says it closed (or the answer
//! ends) and then becomes its calls or its text; with
//! `parallel_tool_calls: false` calls after the first are dropped.

pub const TOOL_CALL_START: &str = "<tool_call>";
pub const TOOL_CALL_END: &str = "</tool_call>";

/// A parsed call; `arguments` is a JSON string, as OpenAI sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutput {
    Text(String),
    Call(ParsedToolCall),
}

/// What a format reads inside its blocks; [`ToolCallStream`] does the rest.
pub trait BlockFormat {
    /// A block opened: its text (after `<tool_call>`) follows.
    fn open(&mut self) {}

    /// Scans the open block, `block` being its text so far; `Some(end)` when
    /// it closed, `end` just past its `</tool_call>`.
    fn scan(&mut self, block: &str) -> Option<usize>;

    /// A finished block (`block`: its text after `<tool_call>`, through
    /// `</tool_call>` unless the answer ended first): its calls, or its
    /// text when it cannot be parsed.
    fn close(&mut self, block: &str) -> Vec<ToolOutput>;
}

/// One streaming parser for streamed and whole answers, of format `F`.
#[derive(Debug, Clone, Default)]
pub struct ToolCallStream<F> {
    format: F,
    /// Inside a `<tool_call>` block.
    inside: bool,
    /// Outside: text that may start a block (trailing whitespace plus a
    /// possible partial tag). Inside: the block so far, after `<tool_call>`.
    held: String,
    calls: usize,
    /// Later calls are dropped (`parallel_tool_calls: false`).
    first_only: bool,
}

impl<F: BlockFormat> ToolCallStream<F> {
    /// A parser of `format`; `parallel: false` keeps the first call and
    /// drops later ones (OpenAI then returns one call; a model prompted
    /// with tools may still write several).
    pub fn new(format: F, parallel: bool) -> Self {
        Self { format, inside: false, held: String::new(), calls: 0, first_only: !parallel }
    }

    /// Calls found so far (kept ones).
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds the next piece of content.
    pub fn push(&mut self, text: &str) -> Vec<ToolOutput> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.inside {
                let Some(end) = self.format.scan(&self.held) else {
                    return out;
                };
                let block: String = self.held.drain(..end).collect();
                self.inside = false;
                let outputs = self.format.close(&block);
                self.keep(outputs, &mut out);
                continue;
            }
            if pass_content(&mut self.held, &mut out) {
                self.inside = true;
                self.format.open();
                continue;
            }
            return out;
        }
    }

    /// The answer ended: an open block is closed as it stands (the format
    /// parses it if it can, else it is text); held text is released
    /// (trailing whitespace dropped after a call).
    pub fn finish(&mut self) -> Vec<ToolOutput> {
        let held = std::mem::take(&mut self.held);
        if self.inside {
            self.inside = false;
            let mut out = Vec::new();
            let outputs = self.format.close(&held);
            self.keep(outputs, &mut out);
            return out;
        }
        release_content(held, self.calls > 0)
    }

    /// Parses a whole answer (tests and tools; serving streams pushes).
    pub fn parse_all(format: F, text: &str) -> Vec<ToolOutput> {
        let mut p = Self::new(format, true);
        let mut out = p.push(text);
        out.extend(p.finish());
        out
    }

    /// A closed block's outputs, less the calls past the first when only
    /// the first is kept (a malformed block's text stays).
    fn keep(&mut self, outputs: Vec<ToolOutput>, out: &mut Vec<ToolOutput>) {
        for o in outputs {
            if let ToolOutput::Call(_) = o {
                if self.first_only && self.calls > 0 {
                    continue;
                }
                self.calls += 1;
            }
            out.push(o);
        }
    }
}

/// Outside a block: moves the content at the front of `held` to `out`.
/// True when a block opened (`held` then starts after its `<tool_call>`);
/// false when what is left of `held` may still start one and waits for
/// more text.
fn pass_content(held: &mut String, out: &mut Vec<ToolOutput>) -> bool {
    if let Some(start) = held.find(TOOL_CALL_START) {
        let before = held[..start].trim_end();
        if !before.is_empty() {
            out.push(ToolOutput::Text(before.to_string()));
        }
        held.drain(..start + TOOL_CALL_START.len());
        return true;
    }
    let cut = held.len() - possible_block_start_len(held);
    if cut > 0 {
        out.push(ToolOutput::Text(held.drain(..cut).collect()));
    }
    false
}

/// The answer ended outside a block: the held text as content, its
/// trailing whitespace dropped after a call; nothing when that is empty.
fn release_content(held: String, after_call: bool) -> Vec<ToolOutput> {
    let text = if after_call { held.trim_end().to_string() } else { held };
    if text.is_empty() {
        Vec::new()
    } else {
        vec![ToolOutput::Text(text)]
    }
}

/// Length of the suffix of `text` that might still turn into the start of
/// a block: a proper prefix of `<tool_call>` and the whitespace before it.
fn possible_block_start_len(text: &str) -> usize {
    let partial = (1..TOOL_CALL_START.len().min(text.len() + 1))
        .rev()
        .find(|&k| text.is_char_boundary(text.len() - k) && TOOL_CALL_START.starts_with(&text[text.len() - k..]))
        .unwrap_or(0);
    let before = &text[..text.len() - partial];
    partial + (before.len() - before.trim_end().len())
}

/// What the parsers' tests share: outputs to compare with, and the ways an
/// answer is cut into streamed pieces.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{ParsedToolCall, ToolOutput};

    pub(crate) fn call(name: &str, arguments: &str) -> ToolOutput {
        ToolOutput::Call(ParsedToolCall { name: name.into(), arguments: arguments.into() })
    }

    pub(crate) fn text(s: &str) -> ToolOutput {
        ToolOutput::Text(s.into())
    }

    /// `raw` with adjacent text outputs merged, so that results compare
    /// independently of how text was cut.
    pub(crate) fn merged(raw: Vec<ToolOutput>) -> Vec<ToolOutput> {
        let mut out: Vec<ToolOutput> = Vec::new();
        for o in raw {
            match (out.last_mut(), o) {
                (Some(ToolOutput::Text(a)), ToolOutput::Text(b)) => a.push_str(&b),
                (_, o) => out.push(o),
            }
        }
        out
    }

    /// `answer` cut in two at every char boundary, then char by char.
    pub(crate) fn splits(answer: &str) -> Vec<Vec<&str>> {
        let mut out: Vec<Vec<&str>> =
            (0..=answer.len()).filter(|&c| answer.is_char_boundary(c)).map(|c| vec![&answer[..c], &answer[c..]]).collect();
        out.push(answer.char_indices().map(|(i, c)| &answer[i..i + c.len_utf8()]).collect());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::text;
    use super::*;

    #[test]
    fn content_passes_until_a_possible_block_start_and_layout_before_a_block_is_dropped() {
        let mut out = Vec::new();
        let mut held = "Sure. \n<tool_".to_string();
        assert!(!pass_content(&mut held, &mut out));
        assert_eq!((out.as_slice(), held.as_str()), ([text("Sure.")].as_slice(), " \n<tool_"));
        held.push_str("call>{}");
        assert!(pass_content(&mut held, &mut out));
        assert_eq!((out.len(), held.as_str()), (1, "{}"));
        // A `<` that cannot start the tag is content.
        let mut held = "a <b".to_string();
        assert!(!pass_content(&mut held, &mut out));
        assert_eq!((out.last(), held.as_str()), (Some(&text("a <b")), ""));
    }

    #[test]
    fn trailing_whitespace_is_dropped_only_after_a_call() {
        assert_eq!(release_content("ok \n".into(), false), [text("ok \n")]);
        assert_eq!(release_content("ok \n".into(), true), [text("ok")]);
        assert!(release_content(" \n".into(), true).is_empty());
        assert!(release_content(String::new(), false).is_empty());
    }
}
