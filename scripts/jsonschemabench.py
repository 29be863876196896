#!/usr/bin/env python3
"""JSONSchemaBench against a running kvc-server (issue 33, item 5).

For each schema of the suite (guidance-ai/jsonschemabench, its
data/<Subset>/*.json), POST /v1/chat/completions with

    response_format: {"type": "json_schema",
                      "json_schema": {"name": ..., "schema": ..., "strict": S}}

and record whether the server accepted it (200), refused it (4xx: the JSON
Schema keyword its message names), or failed (5xx, a transport error or no
answer within --timeout-s: a bug, always reported), or accepted it and then
ended the request with a grammar error during generation (a 400
"structured output: ..." without `param`: also a bug). An accepted answer is
"cut" when finish_reason is "length" (max_tokens reached: neither valid nor
invalid); otherwise its content must parse as JSON and validate against the
schema (the `jsonschema` package, the validator the schema's `$schema`
names, 2020-12 when none; `format` not asserted, as that package's
default). An invalid answer under `strict: false` whose failing keyword is
one the same schema was refused for under `strict: true` (an overlapping
`oneOf` taken as `anyOf`, an ignored `not`, ...) is the relaxation
docs/structured-outputs.md describes and is counted apart from the other
invalid answers, which are bugs (the exit status is 1 when there is one, or
a server or grammar error).

Results: --out (JSON: summary per strictness and subset, one row per
request) and a .rows.jsonl beside it written as rows come; --resume with
such a file reuses its rows for the schemas of this run's sample.

The suite is not fetched here and nothing of it lives in this repository:
pass a directory holding data/<Subset>/*.json, e.g.

    (a clone of the public repository guidance-ai/jsonschemabench in /tmp/jsb-repo)
    git -C /tmp/jsb-repo archive ba103c73 data | tar x -C /tmp/jsb

The script hashes what it reads: SHA-256 over the files under data/ sorted
by path, each as `path` NUL `length` NUL `bytes` (path relative to --suite,
'/'-separated). The digest is printed, and a mismatch with --expect-sha256
(default: the digest measured for the run in docs/benchmarks.md) stops the
run before any request, unless --expect-sha256 is `any`.

The embedded default model has random weights; what is measured is which
schemas are accepted and whether constrained decoding keeps every answer
valid, not answer quality. A random model rarely closes an unbounded string
or array, nor ends a number, so by default the request raises the logits
of the one-character tokens `"` (by twice --close-bias: inside a string it
must beat the others), `]` and `}` (by --close-bias) and `,` (by 0.6 of it)
(Qwen3 ids 1, 60, 92, 11) with `logit_bias`: the grammar still masks them
wherever they are not allowed, so validity is untouched, but more answers
end before max_tokens. --close-bias 0 turns it off.

Standard library plus httpx and jsonschema (scripts/ci_setup.sh's .venv).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import hashlib
import json
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import jsonschema

# Suite commit ba103c73 as the stored snapshot of guidance-ai/jsonschemabench
# has it: 9557 files. That snapshot lacks one blob,
# data/JsonSchemaStore/cloudformation.schema.json (a full checkout of the
# commit has it: its digest differs, pass --expect-sha256 any or its own).
SUITE_COMMIT = "ba103c73756198dd9b149ddc7db7867da7a077f6"
PINNED_SHA256 = "26c94638eed847565cb187cf7a7f08558a9f1a8a2410f407ae7330e852cb0ea3"
PINNED_FILES = 9557

SUBSETS = ["Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra",
           "Glaiveai2K", "JsonSchemaStore", "Kubernetes", "Snowplow", "WashingtonPost"]
# Qwen3 tokenizer ids and the share of --close-bias each gets: '"' most (inside
# a string it must win), then ']' and '}', then ',' (after a number with a
# required property still to come; below ']' and '}' so arrays and objects
# end when they may).
CLOSE_TOKENS = {1: 2.0, 60: 1.0, 92: 1.0, 11: 0.6}
PROMPT = "Answer with one JSON value that follows the schema."

# JSON Schema keywords a refusal may name, longest first so that
# `additionalProperties` is not read as `properties`.
KEYWORDS = sorted({
    "$ref", "$defs", "definitions", "$id", "$anchor", "$dynamicRef", "$recursiveRef", "additionalItems",
    "additionalProperties", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependencies",
    "dependentRequired", "dependentSchemas", "contains", "minContains", "maxContains", "propertyNames",
    "patternProperties", "unevaluatedProperties", "unevaluatedItems", "uniqueItems", "minProperties",
    "maxProperties", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "multipleOf",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "prefixItems", "items", "const", "enum",
    "required", "type", "properties",
}, key=len, reverse=True)


def die(msg: str) -> None:
    print(f"jsonschemabench: {msg}", file=sys.stderr)
    sys.exit(2)


def suite_files(suite: Path) -> dict[str, list[Path]]:
    data = suite / "data"
    if not data.is_dir():
        die(f"--suite {suite}: no data/ directory there. The suite is not in this repository; get it with\n"
            f"  (a clone of the public repository guidance-ai/jsonschemabench in /tmp/jsb-repo) "
            f"git -C /tmp/jsb-repo archive {SUITE_COMMIT[:8]} data | tar x -C {suite}")
    out = {}
    for sub in sorted(p for p in data.iterdir() if p.is_dir()):
        files = sorted(sub.glob("*.json"), key=lambda p: p.name)
        if files:
            out[sub.name] = files
    missing = [s for s in SUBSETS if s not in out]
    if missing:
        die(f"--suite {suite}: data/ lacks the subsets {missing} (found {sorted(out)})")
    return out


def digest(suite: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    paths = sorted(p.relative_to(suite).as_posix() for p in (suite / "data").rglob("*") if p.is_file())
    for rel in paths:
        b = (suite / rel).read_bytes()
        h.update(rel.encode() + b"\0" + str(len(b)).encode() + b"\0" + b)
    return h.hexdigest(), len(paths)


def sample(files: list[Path], n: int | None) -> list[Path]:
    """All of them, or n of them: every k-th of the sorted names."""
    if not n or n >= len(files):
        return list(files)
    k = len(files) // n
    return files[::k][:n]


def refusal_keyword(msg: str) -> str:
    """The JSON Schema keyword a refusal names (the first one quoted, or in
    llguidance's `Unimplemented keys: [...]`), else a short class."""
    low = msg.lower()
    m = re.search(r"Unimplemented keys: \[([^\]]*)\]", msg)
    if m:
        keys = sorted(k.strip().strip('"\\') for k in m.group(1).split(","))
        return "+".join(k for k in keys if k)
    if "oneof" in low:
        return "oneOf"
    if "unknown format" in low or "format" in low and "unknown" in low:
        return "format"
    if "512 kib" in low or "too large" in low or "size limit" in low:
        return "grammar size"
    if "min/maxproperties" in low:
        return "min/maxProperties"
    if "patternproperty" in low and "disjoint" in low:
        return "patternProperties (overlapping)"
    if "intersection stack" in low:
        return "allOf (intersection depth)"
    if "schema too large" in low:
        return "grammar size"
    if "too many expressions" in low:
        return "grammar size (lexer)"
    if "lookaround" in low or "regex parse error" in low and re.search(r"\(\?<?[=!]", msg):
        return "pattern (lookaround)"
    if "regex is empty" in low:
        return "pattern (unsatisfiable)"
    if "only absolute $ref" in low:
        return "$ref (not #/...)"
    if "circular" in low:
        return "$ref (recursive, with siblings)"
    if "reference" in low or "$ref" in low:
        return "$ref"
    if "regex" in low or "pattern" in low:
        return "pattern"
    if "empty" in low or "unsatisfiable" in low or "false schema" in low:
        return "unsatisfiable"
    for k in KEYWORDS:
        if re.search(r"[`'\"]" + re.escape(k) + r"[`'\"]", msg):
            return k
    return "other: " + re.sub(r"\s+", " ", msg)[:60]


def refusal_outcome(msg: str) -> str:
    """`refused` when the schema was turned down up front (the message names
    `response_format`); `grammar_error` when it compiled and the request
    then ended with an error from the grammar during generation (the engine's
    `grammar_error` event, answered 400 "structured output: ..." without a
    `param`): accepted, then failed."""
    return "grammar_error" if msg.startswith("structured output:") else "refused"


def validator_for(schema):
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        return cls(schema), None
    except Exception as e:  # noqa: BLE001: a schema the validator itself rejects
        return None, f"{type(e).__name__}: {str(e)[:200]}"


def run_one(client: httpx.Client, args, path: Path, strict: bool) -> dict:
    rel = f"{path.parent.name}/{path.name}"
    row = {"id": rel, "subset": path.parent.name, "strict": strict}
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        row.update(outcome="unreadable", detail=str(e)[:200])
        return row
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "seed": 0,
        "chat_template_kwargs": {"enable_thinking": False},
        "response_format": {"type": "json_schema", "json_schema": {
            "name": re.sub(r"[^a-zA-Z0-9_-]", "_", path.stem)[:64], "schema": schema, "strict": strict}},
    }
    if args.close_bias:
        body["logit_bias"] = {str(t): round(args.close_bias * share, 3) for t, share in CLOSE_TOKENS.items()}
    t0 = time.monotonic()
    try:
        r = client.post(f"{args.url}/v1/chat/completions", json=body, timeout=args.timeout_s)
    except httpx.TimeoutException:
        row.update(outcome="server_error", http=None, detail=f"no answer within {args.timeout_s} s")
        return row
    except httpx.TransportError as e:
        row.update(outcome="server_error", http=None, detail=f"{type(e).__name__}: {e}")
        return row
    row["seconds"] = round(time.monotonic() - t0, 2)
    row["http"] = r.status_code
    if r.status_code >= 500:
        row.update(outcome="server_error", detail=r.text[:500])
        return row
    if r.status_code != 200:
        try:
            err = r.json()["error"]
            msg, param, code = err.get("message", ""), err.get("param"), err.get("code")
        except (ValueError, KeyError, TypeError):
            msg, param, code = r.text, None, None
        row.update(outcome=refusal_outcome(msg), keyword=refusal_keyword(msg), param=param, code=code, detail=msg[:500])
        return row
    choice = r.json()["choices"][0]
    content = choice["message"].get("content") or ""
    row.update(finish_reason=choice.get("finish_reason"),
               completion_tokens=r.json().get("usage", {}).get("completion_tokens"))
    if choice.get("finish_reason") == "length":
        row.update(outcome="cut", content=content[:300] + (" ... " + content[-200:] if len(content) > 500 else content[300:]))
        return row
    try:
        value = json.loads(content)
    except ValueError as e:
        row.update(outcome="invalid", detail=f"not JSON: {e}", content=content[:1000])
        return row
    validator, schema_err = validator_for(schema)
    if validator is None:
        row.update(outcome="unchecked", detail=f"the validator rejects the schema: {schema_err}")
        return row
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except Exception as e:  # noqa: BLE001: e.g. a remote $ref the validator cannot resolve offline
        row.update(outcome="unchecked", detail=f"validator failed: {type(e).__name__}: {str(e)[:200]}")
        return row
    if errors:
        e = errors[0]
        row.update(outcome="invalid", error_keyword=str(e.validator), detail=f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
                   f" (schema path {'/'.join(map(str, e.absolute_schema_path))})", content=content[:1000])
    else:
        row.update(outcome="valid")
    return row


# Keywords llguidance does not enforce without strict (docs/structured-outputs.md):
# an answer failing one of them is the documented relaxation, not a bug.
RELAXED = {"oneOf", "uniqueItems", "not", "if", "then", "else", "dependencies", "dependentRequired",
           "dependentSchemas", "contains", "minContains", "maxContains", "propertyNames", "minProperties",
           "maxProperties", "unevaluatedProperties", "unevaluatedItems"}


def mark_relaxed(rows: list[dict]) -> None:
    """A non-strict invalid answer is `relaxed` when the same schema was
    refused under strict (or has no strict row) and the keyword it fails, or
    one above it in the schema path, is one llguidance relaxes (RELAXED) or
    one the strict refusal names. When strict accepted the schema, every
    keyword was enforceable and an invalid answer is a bug."""
    refused = {r["id"]: r.get("detail", "") for r in rows if r["strict"] and r["outcome"] == "refused"}
    has_strict = {r["id"] for r in rows if r["strict"]}
    for r in rows:
        if r["outcome"] != "invalid" or r["strict"]:
            continue
        # The failing keyword and those it sits under (`allOf/1/then/required`
        # fails for an ignored `then`).
        m = re.search(r"\(schema path ([^)]*)\)$", r.get("detail", ""))
        kws = {r.get("error_keyword", "")} | set(m.group(1).split("/") if m else [])
        kws.discard("")
        if r["id"] in has_strict and r["id"] not in refused:
            r["relaxed"] = False  # strict accepted it: every keyword was enforceable
            continue
        msg = refused.get(r["id"], "")
        r["relaxed"] = bool(kws & RELAXED) or any(re.search(r"[`\"]" + re.escape(k) + r"[`\"]", msg) for k in kws)


def summarize(rows: list[dict]) -> dict:
    c = collections.Counter(r["outcome"] for r in rows)
    relaxed = sum(1 for r in rows if r["outcome"] == "invalid" and r.get("relaxed"))
    kw = collections.Counter(r["keyword"] for r in rows if r["outcome"] == "refused")
    n = len(rows)
    accepted = c["valid"] + c["invalid"] + c["cut"] + c["unchecked"] + c["grammar_error"]
    return {"schemas": n, "accepted": accepted, "accepted_pct": round(100 * accepted / n, 1) if n else 0.0,
            "refused": c["refused"], "refused_by_keyword": dict(kw.most_common()), "valid": c["valid"],
            "invalid": c["invalid"], "invalid_relaxed": relaxed, "invalid_ids": [r["id"] for r in rows if r["outcome"] == "invalid"],
            "cut": c["cut"], "unchecked": c["unchecked"],
            "completed": c["valid"] + c["invalid"], "server_error": c["server_error"], "grammar_error": c["grammar_error"],
            "grammar_error_ids": [r["id"] for r in rows if r["outcome"] == "grammar_error"], "unreadable": c["unreadable"]}


def markdown(summary: dict, strictness: list[bool]) -> str:
    out = []
    for strict in strictness:
        key = "strict" if strict else "non-strict"
        out += [f"`strict: {str(strict).lower()}`", "",
                "| subset | schemas | accepted | refused (top 3 keywords) | valid / completed | invalid: relaxed keyword / other | cut | grammar error after acceptance | 5xx or no answer |",
                "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
        per = summary[key]
        for name in [*SUBSETS, "total"]:
            if name not in per:
                continue
            s = per[name]
            top = ", ".join(f"`{k}` {v}" for k, v in list(s["refused_by_keyword"].items())[:3]) or "-"
            if len(s["refused_by_keyword"]) > 3 and name != "total":
                top += f", {sum(list(s['refused_by_keyword'].values())[3:])} other"
            if name == "total":
                top = ", ".join(f"`{k}` {v}" for k, v in list(s["refused_by_keyword"].items())[:8]) or "-"
            extra = f" (+{s['unchecked']} unchecked)" if s["unchecked"] else ""
            label = "**total**" if name == "total" else name
            out.append(f"| {label} | {s['schemas']} | {s['accepted']} ({s['accepted_pct']} %) | {s['refused']}: {top} |"
                       f" {s['valid']} / {s['completed']}{extra} | {s['invalid_relaxed']} / {s['invalid'] - s['invalid_relaxed']} |"
                       f" {s['cut']} | {s['grammar_error']} | {s['server_error']} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", type=Path, required=True, help="directory holding data/<Subset>/*.json")
    ap.add_argument("--expect-sha256", default=PINNED_SHA256,
                    help=f"digest the suite's data files must have (default: pinned, commit {SUITE_COMMIT[:8]}); `any` skips the check")
    ap.add_argument("--per-subset", type=int, default=0, help="schemas per subset (every k-th sorted name); 0: all")
    ap.add_argument("--url", default="http://127.0.0.1:18931", help="base URL of a running kvc-server")
    ap.add_argument("--model", default="kvc-default")
    ap.add_argument("--strict", choices=["true", "false", "both"], default="both")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--close-bias", type=float, default=5.0,
                    help="logit bias on the tokens '\"', ']' and '}' so that a random model ends strings and arrays (0: none)")
    ap.add_argument("--timeout-s", type=float, default=600, help="a request without an answer by then is a server error")
    ap.add_argument("--subsets", default="", help="comma-separated subsets to run (default: all ten)")
    ap.add_argument("--out", type=Path, default=Path("jsonschemabench.json"), help="JSON results (per schema and summary)")
    ap.add_argument("--markdown", type=Path, help="also write the tables here")
    ap.add_argument("--resume", type=Path, action="append", default=[],
                    help="a .rows.jsonl of an earlier run on the same suite and server: its rows for schemas in this run's sample are reused, not requested again")
    args = ap.parse_args()
    args.url = args.url.rstrip("/")

    if not args.suite.is_dir():
        die(f"--suite {args.suite} is not a directory. The suite is not in this repository: clone "
            f"the public repository guidance-ai/jsonschemabench at {SUITE_COMMIT[:8]} and pass the directory holding its data/")
    files = suite_files(args.suite)
    sha, count = digest(args.suite)
    print(f"suite {args.suite}: {count} data files, sha256 {sha}", flush=True)
    if args.expect_sha256 != "any" and sha != args.expect_sha256:
        die(f"the suite's digest {sha} ({count} files) is not the expected {args.expect_sha256}"
            f"{f' (commit {SUITE_COMMIT[:8]} as the pinned snapshot has it, {PINNED_FILES} files)' if args.expect_sha256 == PINNED_SHA256 else ''}."
            " A different commit or changed files: results would not compare. (A full checkout of the commit also has"
            " data/JsonSchemaStore/cloudformation.schema.json, which the pinned snapshot lacks: remove it to compare.)"
            " Pass --expect-sha256 any to run anyway.")

    try:
        httpx.get(f"{args.url}/health", timeout=10).raise_for_status()
    except httpx.HTTPError as e:
        die(f"no kvc-server answering at {args.url}/health ({e}); start one, e.g. kvc-server --host 127.0.0.1 --port 18931")

    chosen = [s.strip() for s in args.subsets.split(",") if s.strip()] or SUBSETS
    work = [p for s in chosen for p in sample(files[s], args.per_subset)]
    strictness = {"true": [True], "false": [False], "both": [True, False]}[args.strict]
    jobs = [(p, st) for p in work for st in strictness]
    reused = {}
    for path in args.resume:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            reused[(r["id"], r["strict"])] = r
    wanted = {(f"{p.parent.name}/{p.name}", st) for p, st in jobs}
    reused = {k: v for k, v in reused.items() if k in wanted}
    jobs = [(p, st) for p, st in jobs if (f"{p.parent.name}/{p.name}", st) not in reused]
    print(f"{len(work)} schemas x {len(strictness)} strictness: {len(jobs)} requests to send"
          f"{f', {len(reused)} rows reused from ' + ', '.join(map(str, args.resume)) if args.resume else ''}"
          f", concurrency {args.concurrency}", flush=True)

    rows: list[dict] = list(reused.values())
    lock = threading.Lock()
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    partial = args.out.with_suffix(".rows.jsonl")  # each row as it comes, for a run cut short
    with httpx.Client(limits=limits) as client, concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool, \
            open(partial, "w") as log:
        for row in rows:
            log.write(json.dumps(row) + "\n")
        futs = [pool.submit(run_one, client, args, p, st) for p, st in jobs]
        for i, f in enumerate(concurrent.futures.as_completed(futs), 1):
            row = f.result()
            with lock:
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
            if row["outcome"] in ("invalid", "server_error", "grammar_error"):
                print(f"  {row['outcome'].upper()}: {row['id']} strict={row['strict']}: {row.get('detail', '')[:300]}", flush=True)
            if i % 50 == 0 or i == len(jobs):
                c = collections.Counter(r["outcome"] for r in rows)
                print(f"  {i}/{len(jobs)} new in {time.monotonic() - t0:.0f} s: {dict(c)}", flush=True)

    rows.sort(key=lambda r: (not r["strict"], r["id"]))
    for r in rows:  # rows reused from a run of an earlier version get today's classes
        if r["outcome"] in ("refused", "grammar_error"):
            r["keyword"] = refusal_keyword(r.get("detail", ""))
            r["outcome"] = refusal_outcome(r.get("detail", ""))
    mark_relaxed(rows)
    summary = {}
    for st in strictness:
        key = "strict" if st else "non-strict"
        mine = [r for r in rows if r["strict"] == st]
        summary[key] = {s: summarize([r for r in mine if r["subset"] == s]) for s in chosen}
        summary[key]["total"] = summarize(mine)
    meta = {"date": datetime.date.today().isoformat(), "suite_commit": SUITE_COMMIT, "suite_sha256": sha,
            "suite_files": count, "per_subset": args.per_subset or "all", "reused_rows": len(reused), "max_tokens": args.max_tokens,
            "close_bias": args.close_bias, "concurrency": args.concurrency, "url": args.url,
            "wall_s": round(time.monotonic() - t0, 1)}
    args.out.write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    table = markdown(summary, strictness)
    if args.markdown:
        args.markdown.write_text(table)
    print(table)
    bad = {k: (v["total"]["invalid"] - v["total"]["invalid_relaxed"], v["total"]["server_error"] + v["total"]["grammar_error"])
           for k, v in summary.items()}
    print(f"wrote {args.out}; invalid (not from a relaxed keyword) / server or grammar errors by strictness: {bad}; {meta['wall_s']} s")
    sys.exit(1 if any(i or e for i, e in bad.values()) else 0)


if __name__ == "__main__":
    main()
