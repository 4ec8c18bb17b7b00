//! Label selectors as the API server reads them (`labelSelector=` in a list or watch): every
//! form the recorded Node lists use — `k=v`, `k in (a,b)`, `k` (exists), `!k` (absent) — and the
//! rest of the grammar (`k==v`, `k!=v`, `k notin (a,b)`); `k===x` is the recorded 400
//! (`node-list-label-invalid-400`: "unable to parse requirement: found '=', expected:
//! identifier").

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

/// A parsed selector: all its requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

fn key(text: &str) -> Result<String, String> {
    let key = text.trim();
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
    match valid {
        true => Ok(key.to_owned()),
        false => Err(format!(
            "unable to parse requirement: invalid label key {key:?}"
        )),
    }
}

fn value(text: &str) -> Result<String, String> {
    let value = text.trim();
    if value.starts_with('=') {
        return Err("unable to parse requirement: found '=', expected: identifier".into());
    }
    let valid = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    match valid {
        true => Ok(value.to_owned()),
        false => Err(format!(
            "unable to parse requirement: invalid label value {value:?}"
        )),
    }
}

/// `k in (a,b)` / `k notin (a,b)`, if `term` is one.
fn set(term: &str) -> Option<Result<Requirement, String>> {
    for (word, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((k, rest)) = term.split_once(word) {
            let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
            let values: Result<Vec<String>, String> = inner.split(',').map(value).collect();
            return Some(key(k).and_then(|k| {
                let values = values?;
                Ok(match negated {
                    true => Requirement::NotIn(k, values),
                    false => Requirement::In(k, values),
                })
            }));
        }
    }
    None
}

fn requirement(term: &str) -> Result<Requirement, String> {
    let term = term.trim();
    if let Some(parsed) = set(term) {
        return parsed;
    }
    if let Some(k) = term.strip_prefix('!') {
        return Ok(Requirement::Absent(key(k)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(key(k)?, value(v)?));
    }
    Ok(Requirement::Exists(key(term)?))
}

/// The terms of `text`, split at the commas outside parentheses.
fn terms(text: &str) -> Vec<&str> {
    let (mut terms, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms.into_iter().filter(|t| !t.trim().is_empty()).collect()
}

impl Selector {
    /// `Err`: the API server's 400 message.
    pub fn parse(text: &str) -> Result<Self, String> {
        terms(text)
            .into_iter()
            .map(requirement)
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether an object with `labels` (a JSON object, or null) is selected.
    pub fn matches(&self, labels: &Value) -> bool {
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::Absent(k) => label(k).is_none(),
        })
    }
}
