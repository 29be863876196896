//! What gets replayed: a [`Workload`] of sessions of turns, read from one
//! of three trace formats or made by a generator ([`crate::synth`]).
//!
//! - [`mooncake`]: Mooncake FAST'25 JSONL, independent requests with hash ids.
//! - [`bailian`]: Qwen-Bailian-style session JSONL with parent links and hash ids.
//! - [`session`]: kvc's own session format (see the crate README).

pub mod bailian;
pub mod mooncake;
pub mod session;

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::error::{ReplayError, Result};

#[derive(Debug, Clone)]
pub struct Workload {
    /// What this is, for reports: format, file, scale.
    pub source: String,
    pub sessions: Vec<Session>,
}

#[derive(Debug, Clone)]
pub struct Session {
    /// Sent as `session_id` and `x-session-id`; `None` for independent
    /// requests (Mooncake), which rely on the prefix cache alone.
    pub id: Option<String>,
    pub turns: Vec<Turn>,
}

#[derive(Debug, Clone)]
pub struct Turn {
    /// The turn number the trace gives.
    pub turn: usize,
    /// Arrival time in the trace, seconds from the trace's first arrival.
    pub arrival_s: f64,
    /// Pause between the end of the previous turn and this one (trace seconds).
    pub think_s: f64,
    pub prompt: PromptSpec,
    /// Output length asked for (`max_tokens` with `ignore_eos`).
    pub output_tokens: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptSpec {
    /// `len` tokens made of the blocks `hash_ids` names, `block_tokens`
    /// each (the last possibly partial); tokens past the last block are
    /// unique to the request.
    Blocks { hash_ids: Vec<u64>, block_tokens: usize, len: usize },
    /// Built on the session's previous context (its prompt plus the
    /// stand-in for its output).
    Grow(Growth),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Growth {
    /// Previous context + `n` new tokens.
    Append(usize),
    /// A prompt of `len` tokens: the first `keep` tokens of the previous
    /// context (all of it, if `keep` is `None`, up to `len`), then new
    /// tokens. The first turn of a session is `Input { keep: Some(0) }`.
    Input { len: usize, keep: Option<usize> },
}

impl Workload {
    pub fn requests(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// Keeps the first `max_sessions` sessions and at most `max_turns`
    /// turns of each.
    pub fn truncate(&mut self, max_sessions: Option<usize>, max_turns: Option<usize>) {
        if let Some(n) = max_sessions {
            self.sessions.truncate(n);
        }
        if let Some(n) = max_turns {
            for s in &mut self.sessions {
                s.turns.truncate(n);
            }
        }
    }
}

/// A length multiplier in (0, 1] (or above, to scale up), written as a
/// decimal (`0.25`) or a fraction (`1/32`). Lengths are scaled and rounded,
/// never below one token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    num: f64,
    den: f64,
}

impl Scale {
    pub const ONE: Scale = Scale { num: 1.0, den: 1.0 };

    pub fn factor(&self) -> f64 {
        self.num / self.den
    }

    /// A length scaled, at least 1 when `len` > 0.
    pub fn len(&self, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        ((len as f64 * self.factor()).round() as usize).max(1)
    }

    /// A count scaled (sessions), at least 1.
    pub fn count(&self, n: usize) -> usize {
        ((n as f64 * self.factor()).round() as usize).max(1)
    }

    /// The scaled size of a hash block; an error unless it is a whole
    /// number of tokens (otherwise equal hash ids could not keep equal
    /// token blocks at block boundaries).
    pub fn block(&self, block: usize) -> Result<usize> {
        let b = block as f64 * self.factor();
        if b < 1.0 || (b - b.round()).abs() > 1e-9 {
            return Err(ReplayError::Config(format!(
                "scale {self} makes {block}-token hash blocks {b} tokens long; pick a scale that keeps them whole \
                 (for 512-token Mooncake blocks, 1/32 gives 16 tokens: one kvc KV block)"
            )));
        }
        Ok(b.round() as usize)
    }
}

impl fmt::Display for Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1.0 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

impl FromStr for Scale {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let parse = |x: &str| x.trim().parse::<f64>().map_err(|_| format!("{s:?} is not a scale (use e.g. 0.25 or 1/32)"));
        let (num, den) = match s.split_once('/') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => (parse(s)?, 1.0),
        };
        if !(num > 0.0 && den > 0.0 && (num / den).is_finite()) {
            return Err(format!("scale {s:?} must be positive"));
        }
        Ok(Scale { num, den })
    }
}

/// The trace formats kvc-replay reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Mooncake,
    Bailian,
    Session,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "mooncake" => Ok(Format::Mooncake),
            "bailian" | "qwen" => Ok(Format::Bailian),
            "session" | "kvc" => Ok(Format::Session),
            _ => Err(format!("unknown trace format {s:?} (mooncake, bailian, session)")),
        }
    }
}

/// How a trace is read.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub format: Option<Format>,
    pub scale: Scale,
    /// Tokens per hash id; default 512 for Mooncake, 16 for Bailian.
    pub block_size: Option<usize>,
    /// Skip this many requests (Mooncake) or sessions (others) first.
    pub skip: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { format: None, scale: Scale::ONE, block_size: None, skip: 0 }
    }
}

/// Reads a trace file in `opts.format`, or in the format its first line shows.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Workload> {
    let text = std::fs::read_to_string(path).map_err(|e| ReplayError::io(path, e))?;
    let format = match opts.format {
        Some(f) => f,
        None => {
            detect(&text).ok_or_else(|| ReplayError::trace(path, 1, "cannot tell the trace format from the first line; pass --format"))?
        }
    };
    match format {
        Format::Mooncake => mooncake::parse(path, &text, opts),
        Format::Bailian => bailian::parse(path, &text, opts),
        Format::Session => session::parse(path, &text, opts),
    }
}

/// The format the first non-empty line's fields name.
pub fn detect(text: &str) -> Option<Format> {
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let o = v.as_object()?;
    if o.contains_key("session_id") {
        Some(Format::Session)
    } else if o.contains_key("chat_id") {
        Some(Format::Bailian)
    } else if o.contains_key("hash_ids") || o.contains_key("input_length") {
        Some(Format::Mooncake)
    } else {
        None
    }
}

/// Parses each non-empty line of JSONL text as `T`, with line numbers in errors.
pub(crate) fn jsonl<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<Vec<(usize, T)>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map(|r| (i + 1, r)).map_err(|e| ReplayError::trace(path, i + 1, e.to_string())))
        .collect()
}

/// How a hash-block trace (Mooncake, Bailian) lays its prompts out:
/// `block` tokens per hash id in the trace, `scaled` once its lengths are
/// scaled by `scale`.
pub(crate) struct HashBlocks {
    pub block: usize,
    scaled: usize,
    scale: Scale,
}

impl HashBlocks {
    /// `opts.block_size`, else the format's `default`; an error for a
    /// scale that would cut blocks ([`Scale::block`]).
    pub fn new(opts: &LoadOptions, default: usize) -> Result<HashBlocks> {
        let block = opts.block_size.unwrap_or(default);
        Ok(HashBlocks { block, scaled: opts.scale.block(block)?, scale: opts.scale })
    }

    /// The prompt and output length of a request of the trace (at `line`
    /// of `path`), scaled: `input_length` tokens made of the blocks
    /// `hash_ids` names, `output_length` (at least 1) out. A request
    /// without input is an error.
    pub fn request(
        &self,
        path: &Path,
        line: usize,
        input_length: usize,
        output_length: usize,
        hash_ids: Vec<u64>,
    ) -> Result<(PromptSpec, usize)> {
        if input_length == 0 {
            return Err(ReplayError::trace(path, line, "input_length is 0"));
        }
        let len = scaled_block_len(input_length, self.block, self.scaled, self.scale);
        Ok((PromptSpec::Blocks { len, hash_ids, block_tokens: self.scaled }, self.scale.len(output_length.max(1))))
    }
}

/// The scaled length of a prompt of `input_length` tokens laid out in
/// `block`-token hash blocks: whole blocks become `scaled_block` tokens
/// each, a partial tail is scaled on its own (at least one token), so the
/// scaled prompt keeps its block boundaries aligned.
pub fn scaled_block_len(input_length: usize, block: usize, scaled_block: usize, scale: Scale) -> usize {
    let (full, rem) = (input_length / block, input_length % block);
    full * scaled_block + if rem == 0 { 0 } else { scale.len(rem).clamp(1, scaled_block) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_parse_as_decimals_or_fractions() {
        assert_eq!("1/32".parse::<Scale>().unwrap().factor(), 1.0 / 32.0);
        assert_eq!("0.5".parse::<Scale>().unwrap().factor(), 0.5);
        assert!("0".parse::<Scale>().is_err());
        assert!("x/2".parse::<Scale>().is_err());
        assert_eq!("1/32".parse::<Scale>().unwrap().to_string(), "1/32");
    }

    #[test]
    fn block_scaling_refuses_fractional_blocks() {
        let s: Scale = "1/32".parse().unwrap();
        assert_eq!(s.block(512).unwrap(), 16);
        assert!("0.3".parse::<Scale>().unwrap().block(512).is_err());
        assert!("1/1024".parse::<Scale>().unwrap().block(512).is_err());
    }

    #[test]
    fn scaled_prompts_keep_block_boundaries() {
        let s: Scale = "1/32".parse().unwrap();
        // 78 whole blocks and a 224-token tail: 78 * 16 + 7.
        assert_eq!(scaled_block_len(40160, 512, 16, s), 78 * 16 + 7);
        assert_eq!(scaled_block_len(1024, 512, 16, s), 32);
        // A tiny tail still gets one token.
        assert_eq!(scaled_block_len(513, 512, 16, s), 17);
    }

    #[test]
    fn formats_are_detected_from_their_fields() {
        assert_eq!(detect("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}"), Some(Format::Mooncake));
        assert_eq!(detect("\n{\"chat_id\": 1, \"parent_chat_id\": -1}"), Some(Format::Bailian));
        assert_eq!(detect("{\"session_id\": \"a\", \"turn\": 0}"), Some(Format::Session));
        assert_eq!(detect("{\"x\": 1}"), None);
    }
}
