//! A constraint on what a request may generate (structured outputs): the
//! grammar, and where it starts relative to the model's reasoning. It is
//! part of [`crate::SamplingParams`], so a prefill worker constrains the
//! first token with the same grammar its decode worker uses for the rest.

use serde::{Deserialize, Serialize};

/// The grammar a request's output must match, and where it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Constraint {
    pub grammar: Grammar,
    pub reasoning: ReasoningGate,
}

/// A grammar, in one of the forms the constrained-decoding library
/// compiles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grammar {
    /// A JSON schema (its JSON text). `strict`: keywords the compiler
    /// cannot enforce are an error; otherwise they are ignored.
    JsonSchema { schema: String, strict: bool },
    /// A Lark-style context-free grammar (llguidance's dialect: EBNF rules,
    /// `/regex/` terminals, `%json { schema }` sub-grammars).
    Lark(String),
    /// A regular expression the whole output must match.
    Regex(String),
}

/// Where the grammar starts, for models that reason in a
/// `<think>...</think>` block before answering (as vLLM does with a
/// reasoning parser on, the grammar constrains the answer, not the
/// reasoning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningGate {
    /// From the first generated token (no reasoning, or the prompt already
    /// closed it, as `enable_thinking: false` does).
    #[default]
    Off,
    /// The model may open a reasoning block with its first token;
    /// otherwise the grammar starts at once.
    MayOpen,
    /// The prompt opened the reasoning block: the grammar starts after the
    /// model closes it.
    Open,
}
