//! Structured outputs on the embedded random model: whatever the weights
//! say, the sampled text matches the grammar (checked by serde_json and by
//! hand, not by the grammar library), and the reasoning gate leaves a
//! `<think>` block free.

mod common;

use std::sync::Arc;

use common::{collect, engine};
use kvc_engine::tokenizer::TextTokenizer;
use kvc_engine::{Constraint, EngineError, FinishReason, GenerateRequest, Grammar, GrammarCompiler, ReasoningGate, SamplingParams};
use serde_json::{json, Value};

fn constraint(grammar: Grammar) -> Constraint {
    Constraint { grammar, reasoning: ReasoningGate::Off }
}

fn sampling(seed: u64, c: Constraint) -> SamplingParams {
    SamplingParams { temperature: 1.0, seed: Some(seed), max_tokens: 200, constraint: Some(c), ..Default::default() }
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
            "where": {"type": "object", "properties": {"lat": {"type": "integer", "minimum": -90, "maximum": 90}}, "required": ["lat"], "additionalProperties": false}
        },
        "required": ["city", "unit", "days", "tags", "where"],
        "additionalProperties": false
    })
}

/// What the schema says, checked by hand on the parsed value.
fn conforms(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    if sorted != ["city", "days", "tags", "unit", "where"] {
        return Err(format!("keys {keys:?}"));
    }
    if o["city"].as_str().is_none_or(|s| s.chars().count() > 12) {
        return Err(format!("city {}", o["city"]));
    }
    if !matches!(o["unit"].as_str(), Some("celsius" | "fahrenheit")) {
        return Err(format!("unit {}", o["unit"]));
    }
    if o["days"].as_i64().is_none_or(|d| !(1..=14).contains(&d)) {
        return Err(format!("days {}", o["days"]));
    }
    if o["tags"].as_array().is_none_or(|a| a.len() > 3 || a.iter().any(|b| !b.is_boolean())) {
        return Err(format!("tags {}", o["tags"]));
    }
    let w = o["where"].as_object().ok_or("where is not an object")?;
    if w.len() != 1 || w["lat"].as_i64().is_none_or(|l| !(-90..=90).contains(&l)) {
        return Err(format!("where {}", o["where"]));
    }
    Ok(())
}

#[test]
fn json_schema_answers_parse_and_conform_for_every_seed() {
    let e = engine(|_| {});
    let c = constraint(Grammar::JsonSchema { schema: schema().to_string(), strict: true });
    for seed in 0..12 {
        let req = GenerateRequest {
            request_id: format!("s{seed}"),
            prompt_tokens: common::tokens(seed as u32, 9),
            sampling: sampling(seed, c.clone()),
            ..Default::default()
        };
        let out = collect(&mut e.submit(req).unwrap());
        assert_eq!(out.reason, FinishReason::Stop, "seed {seed}: {:?}", out.text);
        let v: Value = serde_json::from_str(&out.text).unwrap_or_else(|err| panic!("seed {seed}: {err}: {:?}", out.text));
        conforms(&v).unwrap_or_else(|err| panic!("seed {seed}: {err}: {}", out.text));
    }
    let st = common::wait_for(&e, |s| s.grammar_masks > 0);
    assert!(st.grammar_masks > 0);
}

#[test]
fn regex_and_lark_answers_match_their_grammar() {
    let e = engine(|_| {});
    let rx = constraint(Grammar::Regex("[abc]{3}-[0-9]{2}".into()));
    let lark = constraint(Grammar::Lark("start: \"yes\" | \"no\" | \"n=\" NUM\nNUM: /[1-9][0-9]?/\n".into()));
    for seed in 0..6 {
        let req = |c: &Constraint| GenerateRequest {
            request_id: "r".into(),
            prompt_tokens: common::tokens(seed as u32, 5),
            sampling: sampling(seed, c.clone()),
            ..Default::default()
        };
        let out = collect(&mut e.submit(req(&rx)).unwrap());
        let b = out.text.as_bytes();
        assert!(
            b.len() == 6 && b[..3].iter().all(|c| b"abc".contains(c)) && b[3] == b'-' && b[4..].iter().all(u8::is_ascii_digit),
            "seed {seed}: {:?}",
            out.text
        );
        assert_eq!(out.reason, FinishReason::Stop);
        let out = collect(&mut e.submit(req(&lark)).unwrap());
        let t = out.text.as_str();
        let ok = t == "yes"
            || t == "no"
            || t.strip_prefix("n=").is_some_and(|n| n.parse::<u32>().is_ok_and(|n| (1..100).contains(&n)) && !n.starts_with('0'));
        assert!(ok, "seed {seed}: {t:?}");
    }
}

#[test]
fn same_seed_same_structured_answer() {
    let e = engine(|_| {});
    let c = constraint(Grammar::JsonSchema { schema: schema().to_string(), strict: false });
    let run = || {
        let req = GenerateRequest {
            request_id: "d".into(),
            prompt_tokens: common::tokens(3, 7),
            sampling: sampling(42, c.clone()),
            ..Default::default()
        };
        collect(&mut e.submit(req).unwrap()).tokens
    };
    assert_eq!(run(), run());
}

fn compiler() -> (GrammarCompiler, Arc<TextTokenizer>) {
    let tok = Arc::new(TextTokenizer::embedded_qwen3().unwrap());
    let eos = tok.eos_token_ids();
    (GrammarCompiler::new(tok.clone(), &eos).unwrap(), tok)
}

#[test]
fn schemas_that_cannot_be_compiled_are_client_errors() {
    let (c, _) = compiler();
    let bad = [
        Grammar::JsonSchema { schema: "{not json".into(), strict: false },
        Grammar::JsonSchema { schema: json!({"type": "object", "properties": {"a": {"type": "strin"}}}).to_string(), strict: true },
        Grammar::JsonSchema { schema: json!({"$ref": "#/$defs/missing"}).to_string(), strict: true },
        Grammar::Regex("(unclosed".into()),
        Grammar::Lark("start: undefined_rule\n".into()),
    ];
    for g in bad {
        let err = c.compile(&constraint(g.clone())).expect_err(&format!("{g:?} compiled"));
        assert!(matches!(err, EngineError::InvalidGrammar(_)), "{err:?}");
        assert!(err.is_client_error());
    }
}

#[test]
fn the_reasoning_gate_frees_the_think_block_only() {
    let (c, tok) = compiler();
    let open = tok.token_to_id("<think>").unwrap();
    let close = tok.token_to_id("</think>").unwrap();
    let brace = tok.encode("{", false).unwrap()[0];
    let g = Grammar::JsonSchema { schema: json!({"type": "object"}).to_string(), strict: false };
    // MayOpen: the first token is `<think>` or the grammar's.
    let mut s = kvc_engine::constrained::ConstraintState::new(
        c.compile(&Constraint { grammar: g.clone(), reasoning: ReasoningGate::MayOpen }).unwrap(),
    );
    let m = s.mask().unwrap().unwrap();
    assert!(m.is_allowed(open) && m.is_allowed(brace) && !m.is_allowed(close));
    s.advance(open).unwrap();
    assert!(s.mask().unwrap().is_none(), "reasoning is free");
    s.advance(tok.encode("hmm", false).unwrap()[0]).unwrap();
    s.advance(close).unwrap();
    let m = s.mask().unwrap().unwrap();
    assert!(m.is_allowed(brace) && !m.is_allowed(open));
    // Off: `<think>` is just text the grammar does not allow.
    let mut s = kvc_engine::constrained::ConstraintState::new(c.compile(&constraint(g)).unwrap());
    assert!(!s.mask().unwrap().unwrap().is_allowed(open));
    assert!(s.advance(open).is_err());
}

/// A decode worker checks the first token a prefill worker sampled: one
/// the grammar does not allow (a prefill worker that ignored it) ends the
/// request with an error, counted, instead of an answer off the grammar.
#[test]
fn a_first_token_from_elsewhere_that_breaks_the_grammar_ends_the_request() {
    let e = engine(|_| {});
    let prompt = common::tokens(5, 20);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let reservation = rt.block_on(e.reserve(None, None, &prompt)).expect("reserve");
    let letter = e.tokenizer().encode("x", false).unwrap()[0];
    let req = GenerateRequest {
        request_id: "d".into(),
        prompt_tokens: prompt.clone(),
        sampling: sampling(1, constraint(Grammar::Regex("[0-9]+".into()))),
        ..Default::default()
    };
    let mut s = e.submit_reserved(req, reservation, prompt.len(), Some((letter, None))).unwrap();
    let mut error = None;
    while let Some(ev) = s.blocking_recv() {
        match ev {
            kvc_engine::StreamEvent::InvalidGrammar(m) => error = Some(m),
            kvc_engine::StreamEvent::Token { .. } => panic!("a token was streamed after a first token off the grammar"),
            _ => {}
        }
    }
    assert!(error.is_some_and(|m| m.contains("structured output")));
    assert_eq!(common::wait_for(&e, |s| s.grammar_errors == 1).grammar_errors, 1);
}
