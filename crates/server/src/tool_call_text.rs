//! The content around tool-call blocks, the same in every format
//! ([`crate::tool_parser`]'s Hermes blocks, [`crate::tool_parser_qwen3_coder`]'s
//! XML ones): text passes through as soon as it cannot be the start of a
//! `<tool_call>`; whitespace right before a block, and after the last call
//! at the end of the answer, is layout and dropped.

use crate::tool_parser::{ToolOutput, TOOL_CALL_START};

/// Outside a block: moves the content at the front of `held` to `out`.
/// True when a block opened (`held` then starts after its `<tool_call>`);
/// false when what is left of `held` may still start one and waits for
/// more text.
pub(crate) fn pass_content(held: &mut String, out: &mut Vec<ToolOutput>) -> bool {
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
pub(crate) fn release_content(held: String, after_call: bool) -> Vec<ToolOutput> {
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
    use crate::tool_parser::{ParsedToolCall, ToolOutput};

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
