//! Prometheus text exposition: label sets, written once for every metrics
//! module of the server (worker, P/D counters, router).

/// A label value with `\`, `"` and newlines escaped.
pub fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `{k1="v1",k2="v2"}`, values escaped; empty for no labels.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", label_value(v))).collect();
    format!("{{{}}}", parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(labels(&[]), "");
        assert_eq!(labels(&[("tier", "host"), ("reason", "x\"y")]), "{tier=\"host\",reason=\"x\\\"y\"}");
    }
}
