//! Grammars for structured outputs, compiled by llguidance (the
//! constrained-decoding library mistral.rs uses; Rust-native, no Python,
//! masks over a 150K vocabulary in tens of microseconds).
//!
//! [`GrammarCompiler`] holds the tokenizer's token trie (built once per
//! model) and turns a [`Constraint`] into a [`CompiledGrammar`]: a matcher
//! in its start state plus where it starts relative to reasoning. The
//! per-request state that advances it is [`crate::constrained`].

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::TextTokenizer;
use crate::EngineError;
use kvc_wire::{Constraint, Grammar, ReasoningGate};

/// JSON layout the grammars impose unless a schema says otherwise (its
/// `x-guidance` object): `json.dumps` separators and no free whitespace.
/// Free whitespace lets a model pad forever (vLLM grew
/// `disable_any_whitespace` for that); this layout is also the one Qwen3's
/// tool calls use.
pub fn json_options(strict: bool) -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        lenient: !strict,
        ..Default::default()
    }
}

/// Puts the default JSON options into a schema (kept if the schema has its
/// own `x-guidance`). For schemas embedded in a Lark grammar (`%json`).
pub fn with_json_options(mut schema: Value, strict: bool) -> Value {
    if schema.is_object() && schema.get("x-guidance").is_none() {
        json_options(strict).apply_to(&mut schema);
    }
    schema
}

/// The tokenizer as llguidance sees it: token bytes in a trie, and our own
/// tokenizer for the (rare) text it needs tokenized.
struct KvcTokEnv {
    trie: TokTrie,
    tokenizer: Arc<TextTokenizer>,
}

impl TokenizerEnv for KvcTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles constraints for one model's tokenizer.
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// `<think>` / `</think>` token ids, when the vocabulary has them.
    think: Option<(u32, u32)>,
}

impl GrammarCompiler {
    /// Builds the token trie (some hundreds of milliseconds for a 150K
    /// vocabulary): once per engine. `eos` are the ids that end generation
    /// (the grammar allows them where the output may end).
    pub fn new(tokenizer: Arc<TextTokenizer>, eos: &[u32]) -> Result<Self, EngineError> {
        let json = tokenizer.to_json()?;
        let words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| EngineError::Load(format!("grammar compiler: cannot read the vocabulary: {e}")))?;
        let &first_eos = eos.first().ok_or_else(|| EngineError::Load("grammar compiler: the model has no EOS token".into()))?;
        let info = TokRxInfo::new(words.len() as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let think = tokenizer.token_to_id("<think>").zip(tokenizer.token_to_id("</think>"));
        let env: TokEnv = Arc::new(KvcTokEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| EngineError::Load(format!("grammar compiler: {e}")))?;
        factory.quiet();
        // Errors name what failed, not the matcher's state and tokens so
        // far (they go back to clients).
        factory.limits_mut().verbose_errors = false;
        Ok(Self { factory, think })
    }

    /// Compiles `c`; an error names what the library could not compile
    /// (a client error).
    pub fn compile(&self, c: &Constraint) -> Result<CompiledGrammar, EngineError> {
        let bad = |e: String| EngineError::InvalidGrammar(e);
        let top = match &c.grammar {
            Grammar::JsonSchema { schema, strict } => {
                let schema: Value = serde_json::from_str(schema).map_err(|e| bad(format!("the JSON schema is not JSON: {e}")))?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(bad("a JSON schema must be an object".into()));
                }
                TopLevelGrammar::from_json_schema(with_json_options(schema, *strict))
            }
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let parser = self.factory.create_parser(top).map_err(|e| bad(short_error(&e.to_string())))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(bad(short_error(&e)));
        }
        // The first mask, now: a grammar that can match nothing (a regex
        // like `[^\s\S]`, a rule that only recurses) fails here, as a 400
        // before anything is generated, instead of in the first step.
        match matcher.compute_mask_or_eos() {
            Err(e) => return Err(bad(format!("the grammar allows no output ({})", short_error(&e.to_string())))),
            Ok(m) if m.is_zero() => return Err(bad("the grammar allows no output".into())),
            Ok(_) => {}
        }
        let think = match c.reasoning {
            ReasoningGate::Off => None,
            _ => self.think,
        };
        Ok(CompiledGrammar { matcher, reasoning: if think.is_some() { c.reasoning } else { ReasoningGate::Off }, think })
    }

    /// Number of tokens the masks cover (the tokenizer's vocabulary; logits
    /// rows may be wider, padded ids are never allowed).
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }
}

/// A compiled grammar in its start state. Cloning gives an independent
/// matcher (for `n` choices).
pub struct CompiledGrammar {
    pub(crate) matcher: Matcher,
    pub(crate) reasoning: ReasoningGate,
    /// `<think>` / `</think>` ids when the grammar waits for reasoning.
    pub(crate) think: Option<(u32, u32)>,
}

impl Clone for CompiledGrammar {
    fn clone(&self) -> Self {
        Self { matcher: self.matcher.deep_clone(), reasoning: self.reasoning, think: self.think }
    }
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar").field("reasoning", &self.reasoning).finish_non_exhaustive()
    }
}

/// A grammar engine's error as a client may see it: its first lines, not
/// the matcher's internal state it appends (`<state>...`), at most 300
/// characters.
pub fn short_error(e: &str) -> String {
    let head = e.split("<state>").next().unwrap_or(e).trim();
    let mut s: String = head.chars().take(300).collect();
    if s.len() < head.len() {
        s.push_str("...");
    }
    s
}
