//! Grammars for structured outputs, compiled by llguidance (the
//! constrained-decoding library mistral.rs uses; Rust-native, no Python,
//! masks over a 150K vocabulary in tens of microseconds).
//!
//! [`GrammarCompiler`] holds the tokenizer's token trie (built once per
//! model) and turns a [`Constraint`] into a [`CompiledGrammar`]: a matcher
//! in its start state plus where it starts relative to reasoning. The
//! per-request state that advances it is [`crate::constrained`].
//!
//! Compiling is bounded (a client's grammar is untrusted): at most
//! [`MAX_GRAMMAR_BYTES`] of grammar text, and a lexer budget that grows
//! with it ([`compile_fuel`]); the first mask is computed at compile, so a
//! regex like `(a{1000}){1000}` (a million forced bytes) or `a{1000000}`
//! is refused in tens of milliseconds, where the caller compiles (the HTTP
//! handlers: tokio's blocking pool), not in an engine step.

use std::sync::Arc;

use llguidance::api::{GrammarInit, ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{JsonCompileOptions, Logger, Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::TextTokenizer;
use crate::TextFrontError;
use kvc_wire::{Constraint, Grammar, ReasoningGate};

/// JSON layout the grammars impose unless a schema says otherwise (its
/// `x-guidance` object): `json.dumps` separators and no free whitespace.
/// Free whitespace lets a model pad forever (vLLM grew
/// `disable_any_whitespace` for that); this layout is also the one Qwen3's
/// tool calls use.
///
/// Without `strict`, what llguidance cannot enforce exactly is relaxed
/// (`lenient`: unimplemented keywords ignored; `coerce_one_of`: a `oneOf`
/// whose branches may overlap taken as `anyOf`) and logged
/// ([`CompiledGrammar::relaxed`]); with it, that is a compile error. A
/// `oneOf` whose branches cannot overlap is `anyOf` either way (llguidance
/// proves it), and an unknown `format` is dropped either way
/// ([`with_json_options`]).
pub fn json_options(strict: bool) -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        coerce_one_of: !strict,
        lenient: !strict,
        ..Default::default()
    }
}

/// The string `format`s llguidance enforces (its `lookup_format`, not
/// public); `schema_formats_llguidance_knows_compile_under_strict` fails
/// if an upgrade drops one.
pub const LLGUIDANCE_FORMATS: &[&str] =
    &["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri", "unknown"];

/// Puts the default JSON options into a schema (kept if the schema has its
/// own `x-guidance`). For schemas embedded in a Lark grammar (`%json`).
/// A `format` llguidance does not know is removed, strict or not, and
/// logged: JSON Schema makes `format` an annotation unless a validator
/// opts in to asserting it, so the answer still validates (llguidance's
/// `lenient` does the same, but also ignores every other keyword).
pub fn with_json_options(schema: Value, strict: bool) -> Value {
    let (schema, dropped) = prepare_schema(schema, strict);
    for d in &dropped {
        tracing::warn!(event = "schema_relaxed", relaxed = %d, "structured output: not enforced");
    }
    schema
}

/// [`with_json_options`] without the log: the schema and what was dropped
/// from it (`unknown format "int32" ignored`, ...).
fn prepare_schema(mut schema: Value, strict: bool) -> (Value, Vec<String>) {
    let mut dropped = Vec::new();
    if schema.is_object() && schema.get("x-guidance").is_none() {
        drop_unknown_formats(&mut schema, &mut dropped);
        json_options(strict).apply_to(&mut schema);
    }
    (schema, dropped)
}

/// Removes `format` keywords whose (string) value llguidance does not
/// know, from every subschema; data (`const`, `enum`, `default`,
/// `examples`) is left alone, and the members of name maps (`properties`,
/// `$defs`, ...) are schemas whatever their names.
fn drop_unknown_formats(schema: &mut Value, dropped: &mut Vec<String>) {
    let Value::Object(keywords) = schema else { return };
    if let Some(Value::String(f)) = keywords.get("format") {
        if !LLGUIDANCE_FORMATS.contains(&f.as_str()) {
            dropped.push(format!("unknown format {f:?} ignored"));
            keywords.remove("format");
        }
    }
    for (key, value) in keywords.iter_mut() {
        match (key.as_str(), value) {
            ("const" | "enum" | "default" | "examples" | "x-guidance", _) => {}
            ("properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" | "dependencies", Value::Object(named)) => {
                named.values_mut().for_each(|s| drop_unknown_formats(s, dropped));
            }
            (_, Value::Array(items)) => items.iter_mut().for_each(|s| drop_unknown_formats(s, dropped)),
            (_, other) => drop_unknown_formats(other, dropped),
        }
    }
}

/// A compile error in the words of a client who sent `strict: true`: which
/// keyword could not be enforced, and that without `strict` it is relaxed.
fn keyword_error(e: String) -> String {
    if e.contains("oneOf constraints are not supported") {
        "`oneOf` whose branches may overlap cannot be enforced exactly (strict); without strict it is treated as `anyOf`".into()
    } else if e.contains("Unimplemented keys") || e.contains("min/maxProperties") {
        format!("{e}: these keywords cannot be enforced exactly (strict); without strict they are ignored")
    } else {
        e
    }
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

    /// llguidance tokenizes the bytes a grammar forces (every mask, from
    /// where the output is) and allows only the first token. Past
    /// [`CANONICAL_TOKENIZE_BYTES`] the rest is tokenized greedily from the
    /// trie: our BPE over 100 KB of forced `a`s is ~70 ms a mask.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if s.len() <= CANONICAL_TOKENIZE_BYTES {
            return self.canonical_tokens(s);
        }
        let mut cut = CANONICAL_TOKENIZE_BYTES;
        while cut > 0 && s[cut] & 0xC0 == 0x80 {
            cut -= 1;
        }
        let mut tokens = self.canonical_tokens(&s[..cut]);
        // The head's last token could merge across the cut: it is redone.
        tokens.pop();
        let head = self.trie.decode_raw(&tokens);
        if !s.starts_with(&head) {
            return self.trie.greedy_tokenize(s);
        }
        tokens.extend(self.trie.greedy_tokenize(&s[head.len()..]));
        tokens
    }
}

/// Forced bytes tokenized canonically (by the model's tokenizer) before
/// the rest goes greedily; grammars forcing more are pathological.
const CANONICAL_TOKENIZE_BYTES: usize = 1024;

impl KvcTokEnv {
    fn canonical_tokens(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// The largest grammar compiled, in bytes of its text: a JSON schema as
/// serialised, a Lark grammar (the tool-call grammar holds every tool's
/// `parameters`), a regex. 512 KiB: 128 tools of 4 KiB schemas; compiling
/// that much takes some hundreds of milliseconds. vLLM and SGLang have no
/// such limit.
pub const MAX_GRAMMAR_BYTES: usize = 512 * 1024;

/// Lexer fuel a compile may spend: 50K plus 2 per byte of grammar text, at
/// most 1M (llguidance's default for every grammar). llguidance spends it
/// on the lexer's regexes (their size, checked before anything is built),
/// the relevance checks, precomputing large lexemes, and the bytes the
/// grammar forces before its first token (the first mask is computed at
/// compile). Real grammars need little of it (the tool-call grammar of 128
/// strict tools, 125 KB: under 50K; 1000 properties, 57 KB: under 50K; 2400
/// bytes of `\w` patterns: under 25K); a blow-up needs all of it, at about
/// 0.7 µs a unit on a 2-core machine: `(a{1000}){1000}` fails in 15-40 ms
/// (with the default budget it compiled in ~1.5 s, then failed on its first
/// token, in an engine step).
pub fn compile_fuel(grammar_bytes: usize) -> u64 {
    (50_000 + 2 * grammar_bytes as u64).min(1_000_000)
}

/// llguidance's limits for a grammar of `grammar_bytes`, all explicit
/// (its defaults in brackets).
fn limits(grammar_bytes: usize) -> ParserLimits {
    ParserLimits {
        initial_lexer_fuel: compile_fuel(grammar_bytes), // [1M]
        // Per mask, every step (the mask thread; the step waits for it).
        // The worst masks found (`(.*[aeiou].{12}){1,50}`) spend it in
        // ~12 ms on 2 cores and the request fails; real grammars' masks
        // take 0.2-11 ms.
        step_lexer_fuel: 200_000, // [200K]
        step_max_items: 50_000,   // [50K] Earley items a mask
        max_items_in_row: 2000,   // [2000]
        // Lexer states of one request (1-2 kB each), growing as it
        // generates: a string with `minLength: 1000000` reaches 50K after
        // ~1800 tokens, so this stays llguidance's.
        max_lexer_states: 250_000, // [250K]
        // Grammar symbols (llguidance: a few MB of JSON schema).
        max_grammar_size: 500_000, // [500K]
        precompute_large_lexemes: true,
        // Errors name what failed, not the matcher's state and tokens so
        // far (they go back to clients).
        verbose_errors: false,
    }
}

/// The size of a grammar's text (what [`MAX_GRAMMAR_BYTES`] limits).
pub fn grammar_bytes(g: &Grammar) -> usize {
    match g {
        Grammar::JsonSchema { schema, .. } => schema.len(),
        Grammar::Lark(text) | Grammar::Regex(text) => text.len(),
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
    pub fn new(tokenizer: Arc<TextTokenizer>, eos: &[u32]) -> Result<Self, TextFrontError> {
        let json = tokenizer.to_json()?;
        let words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| TextFrontError::Load(format!("grammar compiler: cannot read the vocabulary: {e}")))?;
        let &first_eos = eos.first().ok_or_else(|| TextFrontError::Load("grammar compiler: the model has no EOS token".into()))?;
        let info = TokRxInfo::new(words.len() as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let think = tokenizer.token_to_id("<think>").zip(tokenizer.token_to_id("</think>"));
        let env: TokEnv = Arc::new(KvcTokEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| TextFrontError::Load(format!("grammar compiler: {e}")))?;
        factory.quiet();
        // Each compile passes its own limits (`limits`); these are for
        // anything made from the factory's.
        *factory.limits_mut() = limits(0);
        Ok(Self { factory, think })
    }

    /// Compiles `c` and computes its first mask; an error names what the
    /// library could not compile, or the limit it hit (a client error).
    pub fn compile(&self, c: &Constraint) -> Result<CompiledGrammar, TextFrontError> {
        let bad = |e: String| TextFrontError::InvalidGrammar(e);
        let bytes = grammar_bytes(&c.grammar);
        if bytes > MAX_GRAMMAR_BYTES {
            return Err(bad(format!("it is {bytes} bytes, more than the {} KiB this server compiles", MAX_GRAMMAR_BYTES / 1024)));
        }
        let mut relaxed = Vec::new();
        let top = match &c.grammar {
            Grammar::JsonSchema { schema, strict } => {
                let schema: Value = serde_json::from_str(schema).map_err(|e| bad(format!("the JSON schema is not JSON: {e}")))?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(bad("a JSON schema must be an object".into()));
                }
                let (schema, formats) = prepare_schema(schema, *strict);
                relaxed.extend(formats);
                TopLevelGrammar::from_json_schema(schema)
            }
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let fuel = compile_fuel(bytes);
        let over_budget = |e: &str| bad(budget_error(e, fuel, bytes));
        let mut parser = self
            .factory
            .create_parser_from_init_ext(GrammarInit::Serialized(top), Logger::new(0, 0), InferenceCapabilities::default(), limits(bytes))
            .map_err(|e| bad(keyword_error(budget_error(&e.to_string(), fuel, bytes))))?;
        // What llguidance relaxed (`lenient`, `coerce_one_of`): its
        // warnings, logged with kvc's own (unknown formats).
        relaxed.extend(parser.parser.grammar_warnings());
        for r in &relaxed {
            tracing::warn!(event = "schema_relaxed", relaxed = %r, "structured output: not enforced");
        }
        parser.start_without_prompt();
        // The first mask, now: a grammar that can match nothing (a regex
        // like `[^\s\S]`, a rule that only recurses) fails here, as a 400
        // before anything is generated, instead of in the first step.
        // So does one whose lexer ran out of fuel forcing bytes: the mask
        // is then the first forced token and only the lexer knows.
        let first = parser.compute_mask();
        if let Some(e) = parser.parser.get_error().map(|e| e.message()).filter(|m| m.starts_with("lexer error")) {
            return Err(over_budget(&e));
        }
        match first {
            Err(e) => return Err(bad(format!("the grammar allows no output ({})", short_error(&e.to_string())))),
            Ok(m) if m.is_zero() => return Err(bad("the grammar allows no output".into())),
            Ok(_) => {}
        }
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(bad(short_error(&e)));
        }
        let think = match c.reasoning {
            ReasoningGate::Off => None,
            _ => self.think,
        };
        Ok(CompiledGrammar { matcher, reasoning: if think.is_some() { c.reasoning } else { ReasoningGate::Off }, think, relaxed })
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
    relaxed: Vec<String>,
}

impl CompiledGrammar {
    /// What of the grammar is not enforced (one line each, as logged):
    /// unknown `format`s, and without `strict` llguidance's warnings
    /// (`Unimplemented keys: ["uniqueItems"]`, `oneOf` taken as `anyOf`).
    pub fn relaxed(&self) -> &[String] {
        &self.relaxed
    }
}

impl Clone for CompiledGrammar {
    fn clone(&self) -> Self {
        Self { matcher: self.matcher.deep_clone(), reasoning: self.reasoning, think: self.think, relaxed: self.relaxed.clone() }
    }
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar").field("reasoning", &self.reasoning).finish_non_exhaustive()
    }
}

/// A compile error for the client; one where llguidance ran out of its
/// lexer budget says so in our terms (its own names the knob to raise).
fn budget_error(e: &str, fuel: u64, bytes: usize) -> String {
    let e = short_error(e);
    let lexer = ["too many expressions", "fuel exhausted", "lexer precomputation failed", "initial lexer configuration"];
    if lexer.iter().any(|m| e.contains(m)) {
        let what = if e.contains("initial lexer configuration") { "its regexes are larger than" } else { "compiling it ran past" };
        format!("{what} the lexer budget ({fuel} fuel for a {bytes}-byte grammar; 50000 + 2 a byte, at most 1000000)")
    } else if e.contains("too many states") {
        format!("its lexer needs more than {} states", limits(bytes).max_lexer_states)
    } else {
        e
    }
}

/// A grammar engine's error as a client may see it: its first lines, not
/// the matcher's internal state it appends (`<state>...`, or its marker
/// that it left it out, `<non-verbose/>`), at most 300 characters.
pub fn short_error(e: &str) -> String {
    let cut = ["<state>", "<non-verbose/>"].iter().filter_map(|m| e.find(m)).min().unwrap_or(e.len());
    let head = e[..cut].trim();
    let mut s: String = head.chars().take(300).collect();
    if s.len() < head.len() {
        s.push_str("...");
    }
    s
}
