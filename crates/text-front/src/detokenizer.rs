//! Incremental, UTF-8-safe detokenization.
//!
//! The vLLM / TGI scheme: keep two offsets into the generated ids.
//! `ids[prefix_offset..read_offset]` is a little already-emitted context and
//! `ids[read_offset..]` are tokens whose text has not been emitted yet. Each
//! step decodes `ids[prefix_offset..]` and the context alone; the difference
//! is the new text. Decoding with a bit of context (instead of the new tokens
//! alone) keeps tokenizers whose text depends on the previous token (e.g.
//! SentencePiece's leading space) right. When the decoded text ends in U+FFFD
//! — the last token(s) stop in the middle of a UTF-8 character — nothing is
//! emitted and the offsets stay, so the next token completes the character.
//!
//! Each step decodes only from `prefix_offset`, so its cost is bounded by the
//! window (normally a couple of tokens), not by the length of the output.

use crate::tokenizer::TextTokenizer;

/// Turns a growing list of token ids into text deltas, never emitting a
/// partial UTF-8 character.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

/// The longest prefix of `a` that is also a prefix of `b`, cut at a char
/// boundary of both.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices().zip(b.chars()).find(|((_, ca), cb)| ca != cb).map(|((i, _), _)| i).unwrap_or_else(|| a.len().min(b.len()))
}

impl IncrementalDecoder {
    /// `skip_special_tokens`: special tokens (e.g. `<|im_end|>`) produce no
    /// text.
    pub fn new(skip_special_tokens: bool) -> Self {
        Self { prefix_offset: 0, read_offset: 0, skip_special_tokens }
    }

    fn decode(&self, tokenizer: &TextTokenizer, ids: &[u32]) -> String {
        if ids.is_empty() {
            return String::new();
        }
        tokenizer.decode(ids, self.skip_special_tokens).unwrap_or_default()
    }

    /// Call after each new token is appended to `ids` (generated ids only,
    /// the newest last); returns the text that became final (possibly "").
    pub fn step(&mut self, tokenizer: &TextTokenizer, ids: &[u32]) -> String {
        if ids.len() <= self.read_offset {
            return String::new();
        }
        let prefix_text = self.decode(tokenizer, &ids[self.prefix_offset..self.read_offset]);
        let new_text = self.decode(tokenizer, &ids[self.prefix_offset..]);
        if new_text.len() > prefix_text.len() && !new_text.ends_with('\u{FFFD}') {
            let start = if new_text.starts_with(&prefix_text) { prefix_text.len() } else { common_prefix_len(&new_text, &prefix_text) };
            self.prefix_offset = self.read_offset;
            self.read_offset = ids.len();
            new_text[start..].to_string()
        } else {
            String::new()
        }
    }

    /// Generation ended: returns whatever text is still held back (a
    /// trailing incomplete character comes out as U+FFFD, as a full decode
    /// would show it).
    pub fn flush(&mut self, tokenizer: &TextTokenizer, ids: &[u32]) -> String {
        if ids.len() <= self.read_offset {
            return String::new();
        }
        let prefix_text = self.decode(tokenizer, &ids[self.prefix_offset..self.read_offset]);
        let new_text = self.decode(tokenizer, &ids[self.prefix_offset..]);
        self.prefix_offset = self.read_offset;
        self.read_offset = ids.len();
        let start = common_prefix_len(&new_text, &prefix_text);
        new_text[start..].to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    fn qwen3() -> &'static TextTokenizer {
        static TOK: OnceLock<TextTokenizer> = OnceLock::new();
        TOK.get_or_init(|| TextTokenizer::embedded_qwen3().expect("embedded tokenizer loads"))
    }

    /// Feeds `ids` one at a time; returns the deltas (flush included last).
    fn stream(ids: &[u32], skip_special: bool) -> Vec<String> {
        let tok = qwen3();
        let mut dec = IncrementalDecoder::new(skip_special);
        let mut deltas: Vec<String> = (1..=ids.len()).map(|n| dec.step(tok, &ids[..n])).collect();
        deltas.push(dec.flush(tok, ids));
        deltas
    }

    /// GPT-2 byte-level alphabet: the token text of a single byte.
    fn byte_token(b: u8) -> String {
        let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        if printable(b) {
            return char::from(b).to_string();
        }
        let n = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + n).unwrap().to_string()
    }

    const SAMPLES: &[&str] = &[
        "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{:?}\", x.iter().sum::<i32>());\n}\n",
        "量子计算是一种遵循量子力学规律调控量子信息单元进行计算的新型计算模式。",
        "🦀🚀👍🏽👨‍👩‍👧‍👦🇫🇷 emoji 🙂",
        "Mixed: 你好 world 🌍\n\n  indented\tTabs — “quotes” ÜÄÖ ñ 日本語のテキスト 🎉!",
        "   leading spaces and trailing newlines\n\n\n",
    ];

    #[test]
    fn deltas_concatenate_to_full_decode_and_never_contain_replacement_chars() {
        let tok = qwen3();
        for s in SAMPLES {
            let ids = tok.encode(s, false).unwrap();
            let deltas = stream(&ids, true);
            assert_eq!(deltas.concat(), tok.decode(&ids, true).unwrap(), "sample {s:?}");
            assert_eq!(deltas.concat(), *s);
            for d in &deltas {
                assert!(!d.contains('\u{FFFD}'), "delta {d:?} of {s:?} has U+FFFD");
            }
            // Nothing was left for flush: every character completed in step().
            assert_eq!(deltas.last().unwrap(), "");
        }
    }

    #[test]
    fn split_emoji_emits_nothing_until_complete() {
        let tok = qwen3();
        // 🦀 = F0 9F A6 80, fed as four single-byte tokens.
        let ids: Vec<u32> = "🦀".bytes().map(|b| tok.token_to_id(&byte_token(b)).expect("byte token")).collect();
        assert_eq!(ids.len(), 4);
        let mut dec = IncrementalDecoder::new(true);
        for n in 1..4 {
            assert_eq!(dec.step(tok, &ids[..n]), "", "after {n} bytes");
        }
        assert_eq!(dec.step(tok, &ids), "🦀");

        // Same after some text, and the text before is not held back.
        let mut ids2 = tok.encode("hi ", false).unwrap();
        let mut dec = IncrementalDecoder::new(true);
        let mut out = String::new();
        for n in 1..=ids2.len() {
            out.push_str(&dec.step(tok, &ids2[..n]));
        }
        assert_eq!(out, "hi ");
        for (k, &id) in ids.iter().enumerate() {
            ids2.push(id);
            let d = dec.step(tok, &ids2);
            if k < 3 {
                assert_eq!(d, "");
            } else {
                assert_eq!(d, "🦀");
            }
        }
    }

    #[test]
    fn multi_token_characters_from_the_real_encoder_are_held_back() {
        // Rare CJK/emoji often encode to several byte-level tokens; check
        // that at least one sample really splits a character, and that every
        // intermediate step of it emits nothing.
        let tok = qwen3();
        let mut found_split = false;
        for s in ["𠜎", "🫠", "龘", "🧑‍🚀"] {
            let ids = tok.encode(s, false).unwrap();
            let mut dec = IncrementalDecoder::new(true);
            let mut out = String::new();
            for n in 1..=ids.len() {
                let d = dec.step(tok, &ids[..n]);
                assert!(!d.contains('\u{FFFD}'));
                if n < ids.len() && tok.decode(&ids[..n], true).unwrap().ends_with('\u{FFFD}') {
                    found_split = true;
                }
                out.push_str(&d);
            }
            assert_eq!(out, s);
        }
        assert!(found_split);
    }

    #[test]
    fn special_tokens_produce_no_text_when_skipped() {
        let tok = qwen3();
        let ids = tok.encode("<think>\nhmm\n</think>\n\nHi there<|im_end|>", false).unwrap();
        assert_eq!(*ids.last().unwrap(), 151645);
        let deltas = stream(&ids, true);
        assert_eq!(deltas.concat(), "<think>\nhmm\n</think>\n\nHi there");
        assert_eq!(deltas[ids.len() - 1], "");
        let deltas = stream(&ids, false);
        assert_eq!(deltas.concat(), "<think>\nhmm\n</think>\n\nHi there<|im_end|>");
    }

    #[test]
    fn flush_releases_an_incomplete_tail() {
        let tok = qwen3();
        let ids: Vec<u32> = [b'a', 0xF0, 0x9F].iter().map(|&b| tok.token_to_id(&byte_token(b)).unwrap()).collect();
        let mut dec = IncrementalDecoder::new(true);
        assert_eq!(dec.step(tok, &ids[..1]), "a");
        assert_eq!(dec.step(tok, &ids[..2]), "");
        assert_eq!(dec.step(tok, &ids[..3]), "");
        assert_eq!(dec.flush(tok, &ids), "\u{FFFD}");
        assert_eq!(dec.flush(tok, &ids), "");
    }

    #[test]
    fn window_stays_small() {
        let tok = qwen3();
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
        let ids = tok.encode(&text, false).unwrap();
        let mut dec = IncrementalDecoder::new(true);
        for n in 1..=ids.len() {
            dec.step(tok, &ids[..n]);
            assert!(n - dec.prefix_offset <= 2, "window {} at {n}", n - dec.prefix_offset);
        }
    }
}
