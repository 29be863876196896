//! Log-probabilities in OpenAI's two shapes: chat's
//! `logprobs.content[] = {token, logprob, bytes, top_logprobs[]}` and
//! completions' `{tokens, token_logprobs, top_logprobs: [{token: logprob}],
//! text_offset}`, from the engine's per-token [`Logprobs`].
//!
//! A token's `bytes` are its raw bytes (Qwen3's tokenizer is byte-level
//! BPE, so a token may hold part of a UTF-8 character); `token` is those
//! bytes as text, with U+FFFD for an incomplete character, as OpenAI does.

use std::collections::HashMap;
use std::sync::OnceLock;

use kvc_engine::Logprobs;
use kvc_text_front::tokenizer::TextTokenizer;
use serde::Serialize;
use serde_json::{Map, Value};

/// What JSON cannot carry (`-inf`) is reported as this, like vLLM.
const MIN_LOGPROB: f32 = -9999.0;

/// The most alternatives a request may ask for per token (vLLM's default
/// `max_logprobs`; OpenAI allows 20 in chat and 5 in completions).
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// Where a tokenizer comes from (the engine when serving, a bare tokenizer
/// in tests).
pub trait HasTokenizer: Send + Sync + 'static {
    fn tokenizer(&self) -> &TextTokenizer;
}

impl HasTokenizer for kvc_engine::EngineHandle {
    fn tokenizer(&self) -> &TextTokenizer {
        kvc_engine::EngineHandle::tokenizer(self)
    }
}

impl HasTokenizer for TextTokenizer {
    fn tokenizer(&self) -> &TextTokenizer {
        self
    }
}

/// GPT-2's byte-level alphabet, reversed: the character a byte is written
/// as in the vocabulary -> the byte.
fn byte_decoder() -> &'static HashMap<char, u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 256u32;
        (0..=255u8)
            .map(|b| {
                let c = if printable(b) {
                    char::from(b)
                } else {
                    next += 1;
                    char::from_u32(next - 1).expect("valid char")
                };
                (c, b)
            })
            .collect()
    })
}

/// The raw bytes of token `id`.
pub fn token_bytes(tokenizer: &TextTokenizer, id: u32) -> Vec<u8> {
    if let Some(piece) = tokenizer.id_to_token(id) {
        let table = byte_decoder();
        let bytes: Option<Vec<u8>> = piece.chars().map(|c| table.get(&c).copied()).collect();
        if let Some(bytes) = bytes {
            return bytes;
        }
    }
    // Not byte-level (an added token with unusual characters, another
    // tokenizer): its decoded text.
    tokenizer.decode(&[id], false).unwrap_or_default().into_bytes()
}

fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        MIN_LOGPROB
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

fn top(tokenizer: &TextTokenizer, id: u32, logprob: f32) -> TopLogprob {
    let bytes = token_bytes(tokenizer, id);
    TopLogprob { token: String::from_utf8_lossy(&bytes).into_owned(), logprob: finite(logprob), bytes }
}

/// One generated token in chat's shape (`top_logprobs` = the `k` asked for).
pub fn chat_entry(tokenizer: &TextTokenizer, lp: &Logprobs) -> ChatTokenLogprob {
    let chosen = top(tokenizer, lp.chosen.token_id, lp.chosen.logprob);
    ChatTokenLogprob {
        token: chosen.token,
        logprob: chosen.logprob,
        bytes: chosen.bytes,
        top_logprobs: lp.top.iter().map(|t| top(tokenizer, t.token_id, t.logprob)).collect(),
    }
}

/// A completion choice's `logprobs` (parallel lists, one entry per token).
/// With `echo` they cover the prompt's tokens first, the first of which has
/// no logprob (`null` in `token_logprobs` and `top_logprobs`, as vLLM).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// f64 of the f32, as in `top_logprobs` (JSON then prints both alike,
    /// so a client may compare them exactly: lm-eval's `is_greedy`).
    pub token_logprobs: Vec<Option<f64>>,
    /// The top alternatives and the chosen token, by text (as vLLM).
    pub top_logprobs: Vec<Option<Map<String, Value>>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends one token whose text starts at character `offset`; returns
    /// the token's length in characters.
    pub fn push(&mut self, tokenizer: &TextTokenizer, lp: &Logprobs, offset: usize) -> usize {
        let chosen = top(tokenizer, lp.chosen.token_id, lp.chosen.logprob);
        let mut alternatives = Map::new();
        for t in lp.top.iter().chain(std::iter::once(&lp.chosen)) {
            let t = top(tokenizer, t.token_id, t.logprob);
            alternatives.entry(t.token).or_insert_with(|| Value::from(t.logprob));
        }
        let len = chosen.token.chars().count();
        self.tokens.push(chosen.token);
        self.token_logprobs.push(Some(f64::from(chosen.logprob)));
        self.top_logprobs.push(Some(alternatives));
        self.text_offset.push(offset);
        len
    }

    /// Appends a token without a logprob (a prompt's first), at character
    /// `offset`; returns its length in characters.
    pub fn push_unscored(&mut self, tokenizer: &TextTokenizer, token_id: u32, offset: usize) -> usize {
        let token = String::from_utf8_lossy(&token_bytes(tokenizer, token_id)).into_owned();
        let len = token.chars().count();
        self.tokens.push(token);
        self.token_logprobs.push(None);
        self.top_logprobs.push(None);
        self.text_offset.push(offset);
        len
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn extend(&mut self, other: CompletionLogprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvc_engine::TokenLogprob;

    fn qwen3() -> &'static TextTokenizer {
        static T: OnceLock<TextTokenizer> = OnceLock::new();
        T.get_or_init(|| TextTokenizer::embedded_qwen3().expect("embedded tokenizer"))
    }

    #[test]
    fn byte_alphabet_is_a_bijection_over_all_bytes() {
        let table = byte_decoder();
        assert_eq!(table.len(), 256);
        let mut bytes: Vec<u8> = table.values().copied().collect();
        bytes.sort_unstable();
        assert_eq!(bytes, (0..=255).collect::<Vec<u8>>());
        assert_eq!(table[&'Ġ'], b' ');
        assert_eq!(table[&'Ċ'], b'\n');
    }

    #[test]
    fn token_bytes_concatenate_to_the_encoded_text() {
        let tok = qwen3();
        for text in ["Hello, world!\n", "naïve café 你好 🦊", "<think>\nx\n</think>"] {
            let ids = tok.encode(text, false).unwrap();
            let bytes: Vec<u8> = ids.iter().flat_map(|&id| token_bytes(tok, id)).collect();
            assert_eq!(String::from_utf8(bytes).unwrap(), text);
        }
    }

    #[test]
    fn partial_characters_show_as_replacement_but_keep_their_bytes() {
        let tok = qwen3();
        // A private-use character: no merged token exists for it.
        let ids = tok.encode("\u{F0001}", false).unwrap();
        assert!(ids.len() > 1, "the character spans several byte-level tokens: {ids:?}");
        let lp = Logprobs { chosen: TokenLogprob { token_id: ids[0], logprob: -0.5 }, top: vec![] };
        let e = chat_entry(tok, &lp);
        assert!(e.token.contains('\u{fffd}'));
        assert_eq!(e.bytes, token_bytes(tok, ids[0]));
        assert!(!e.bytes.is_empty() && e.bytes.len() < 4);
    }

    #[test]
    fn chat_entry_lists_top_alternatives_and_clamps_minus_infinity() {
        let tok = qwen3();
        let hello = tok.encode("Hello", false).unwrap()[0];
        let world = tok.encode(" world", false).unwrap()[0];
        let lp = Logprobs {
            chosen: TokenLogprob { token_id: hello, logprob: f32::NEG_INFINITY },
            top: vec![TokenLogprob { token_id: world, logprob: -0.1 }, TokenLogprob { token_id: hello, logprob: -3.0 }],
        };
        let e = chat_entry(tok, &lp);
        assert_eq!((e.token.as_str(), e.logprob), ("Hello", MIN_LOGPROB));
        assert_eq!(e.top_logprobs.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(), vec![" world", "Hello"]);
        assert_eq!(e.top_logprobs[0].bytes, b" world".to_vec());
    }

    #[test]
    fn completion_logprobs_keep_parallel_lists_and_offsets() {
        let tok = qwen3();
        let ids = tok.encode("Hi there", false).unwrap();
        let mut c = CompletionLogprobs::default();
        let mut offset = 3;
        for &id in &ids {
            let lp = Logprobs { chosen: TokenLogprob { token_id: id, logprob: -1.0 }, top: vec![] };
            offset += c.push(tok, &lp, offset);
        }
        assert_eq!(c.tokens.concat(), "Hi there");
        assert_eq!(c.text_offset[0], 3);
        assert_eq!(offset, 3 + "Hi there".len());
        assert_eq!(c.token_logprobs.len(), ids.len());
        // The chosen token is always in its top_logprobs dict.
        assert_eq!(c.top_logprobs[0].as_ref().unwrap().get("Hi"), Some(&Value::from(-1.0f32)));
        // The chosen logprob reads the same in both lists (exact compare).
        let lp = Logprobs { chosen: TokenLogprob { token_id: ids[0], logprob: -9.374_518 }, top: vec![] };
        let mut e = CompletionLogprobs::default();
        e.push(tok, &lp, 0);
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["token_logprobs"][0], v["top_logprobs"][0]["Hi"]);
        // A prompt's first token: no logprob, serialized as null.
        let mut p = CompletionLogprobs::default();
        assert_eq!(p.push_unscored(tok, ids[0], 0), "Hi".len());
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["token_logprobs"], serde_json::json!([null]));
        assert_eq!(v["top_logprobs"], serde_json::json!([null]));
        assert_eq!(v["tokens"], serde_json::json!(["Hi"]));
    }
}
