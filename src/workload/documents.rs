//! The documents of a manifest stream, one at a time: a YAML stream is cut at its document
//! markers (`---`, `...` at the start of a line, which YAML forbids inside any scalar) and each
//! document is parsed alone, so one unreadable document loses nothing else, memory holds one
//! document at a time, and every position is a line of the input itself.

use std::collections::VecDeque;
use std::fmt;
use std::io::BufRead;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Where something was read: a file (`-` for standard input, `cluster` for `audit`), the number
/// of its document (from 1, as YAML counts them) and the line that document starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) file: String,
    pub(crate) document: Option<usize>,
    pub(crate) line: Option<usize>,
}

impl Place {
    pub(crate) fn file(file: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            document: None,
            line: None,
        }
    }

    /// `file:document` (or the file alone): the SOURCE column.
    pub(crate) fn source(&self) -> String {
        match self.document {
            Some(document) => format!("{}:{document}", self.file),
            None => self.file.clone(),
        }
    }
}

impl fmt::Display for Place {
    /// `apps.yaml:2 (line 14)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source())?;
        match self.line {
            Some(line) => write!(f, " (line {line})"),
            None => Ok(()),
        }
    }
}

/// An input that is not reviewed, where it is, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unread {
    pub(crate) place: Place,
    pub(crate) reason: String,
}

impl fmt::Display for Unread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.reason)
    }
}

/// One document's text and where it is.
#[derive(Debug)]
pub(crate) struct Document {
    pub(crate) place: Place,
    pub(crate) text: String,
    /// The input's line the text's first line is.
    first_line: usize,
}

/// A document larger than this is not read (its lines are passed over): memory is bounded by
/// the largest document, and a document is bounded here.
pub(crate) const MAX_DOCUMENT_BYTES: usize = 64 << 20;

/// The documents of one stream, in order; empty documents (blank, comments only) are passed
/// over as kubectl passes them over; an empty stream is one `Unread`.
pub(crate) struct Documents<R> {
    reader: R,
    file: String,
    /// Lines read so far.
    lines: usize,
    /// Documents begun so far (empty ones included: YAML's numbering).
    number: usize,
    /// The marker line (`--- …`) that begins the next document.
    pending: Option<String>,
    yielded: bool,
    ended: bool,
    /// The rest of a JSON stream's values, each a document of its own.
    queued: VecDeque<Document>,
}

impl<R: BufRead> Documents<R> {
    pub(crate) fn new(reader: R, file: impl Into<String>) -> Self {
        Self {
            reader,
            file: file.into(),
            lines: 0,
            number: 0,
            pending: None,
            yielded: false,
            ended: false,
            queued: VecDeque::new(),
        }
    }

    /// The next line, `None` at the end; an I/O error or text that is not UTF-8 ends the stream.
    fn line(&mut self) -> Result<Option<String>, String> {
        let mut bytes = Vec::new();
        let limit = MAX_DOCUMENT_BYTES as u64 + 1;
        let read = std::io::Read::take(&mut self.reader, limit)
            .read_until(b'\n', &mut bytes)
            .map_err(|e| format!("cannot read: {e}"))?;
        if read == 0 {
            return Ok(None);
        }
        self.lines += 1;
        if self.lines == 1 && bytes.starts_with(b"\xef\xbb\xbf") {
            // A UTF-8 byte order mark, which editors on Windows write: not part of the text.
            bytes.drain(..3);
        }
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| format!("line {}: not UTF-8 text", self.lines))
    }

    fn unread(&self, document: Option<usize>, line: usize, reason: String) -> Unread {
        Unread {
            place: Place {
                file: self.file.clone(),
                document,
                line: Some(line),
            },
            reason,
        }
    }

    /// Reads up to the end of the next document with content.
    fn next_document(&mut self) -> Option<Result<Document, Unread>> {
        // A document begun by the marker line read last, or at the next line.
        let (mut text, mut first_line) = match self.pending.take() {
            Some(marker) => (marker, self.lines),
            None => (String::new(), self.lines + 1),
        };
        let mut begun = !text.is_empty();
        let mut content_line = (begun && has_content_after_marker(&text)).then_some(self.lines);
        loop {
            let line = match self.line() {
                Ok(Some(line)) => line,
                Ok(None) => {
                    self.ended = true;
                    break;
                }
                Err(reason) => {
                    // Said once: the stream ends here, and is not also "empty".
                    self.ended = true;
                    self.yielded = true;
                    return Some(Err(self.unread(None, self.lines.max(1), reason)));
                }
            };
            let marker = marker(&line);
            if marker == Some(Marker::Start) {
                if content_line.is_some() {
                    self.pending = Some(line);
                    break;
                }
                if begun {
                    // An empty document: counted, as YAML counts it, and passed over.
                    self.number += 1;
                }
                begun = true;
                first_line = self.lines;
                text = line;
                if has_content_after_marker(&text) {
                    content_line = Some(self.lines);
                }
                continue;
            }
            if marker == Some(Marker::End) {
                if content_line.is_some() {
                    break;
                }
                continue;
            }
            if content_line.is_none() && is_content(&line) {
                content_line = Some(self.lines);
            }
            if text.len() + line.len() > MAX_DOCUMENT_BYTES {
                let at = content_line.unwrap_or(first_line);
                self.number += 1;
                let number = self.number;
                self.pass_over_document();
                return Some(Err(self.unread(
                    Some(number),
                    at,
                    format!("a document over {} MiB: not read", MAX_DOCUMENT_BYTES >> 20),
                )));
            }
            text.push_str(&line);
        }
        let line = content_line?;
        self.number += 1;
        self.yielded = true;
        Some(Ok(Document {
            place: Place {
                file: self.file.clone(),
                document: Some(self.number),
                line: Some(line),
            },
            text,
            first_line,
        }))
    }

    /// Reads on to the next document marker without keeping anything.
    fn pass_over_document(&mut self) {
        loop {
            match self.line() {
                Ok(Some(line)) if marker(&line) == Some(Marker::Start) => {
                    self.pending = Some(line);
                    return;
                }
                Ok(Some(_)) => {}
                _ => {
                    self.ended = true;
                    return;
                }
            }
        }
    }
}

/// A JSON stream or JSON Lines (`kubectl get -o json` output run together, `jq -c`): its
/// values and where each is, when the text starts with a JSON value; from a value that is not
/// JSON on, the rest is one piece (read as YAML, or said to be neither, with its line).
fn json_values(text: &str) -> Vec<(usize, usize)> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<IgnoredAny>();
    let mut pieces = Vec::new();
    let mut end = 0;
    while let Some(item) = stream.next() {
        let rest = &text[end..];
        let start = end + (rest.len() - rest.trim_start().len());
        if item.is_err() {
            if !pieces.is_empty() {
                pieces.push((start, text.len()));
            }
            return pieces;
        }
        end = stream.byte_offset();
        pieces.push((start, end));
    }
    pieces
}

impl<R: BufRead> Documents<R> {
    /// `document`, or the first value of the JSON stream it is (the others queued, each
    /// numbered as a document and placed at its own line).
    fn split(&mut self, document: Document) -> Document {
        let Some((skipped, body)) = document.json_body() else {
            return document;
        };
        let pieces = json_values(body);
        if pieces.len() < 2 {
            return document;
        }
        let offset = document.text.len() - body.len();
        let pieces: Vec<(usize, usize)> = pieces
            .into_iter()
            .map(|(start, end)| (start + offset, end + offset))
            .collect();
        let _ = skipped;
        let mut number = document.place.document.unwrap_or(self.number);
        let file = &self.file;
        let mut values = pieces.into_iter().map(|(start, end)| {
            let line = document.first_line + document.text[..start].matches('\n').count();
            Document {
                place: Place {
                    file: file.clone(),
                    document: None,
                    line: Some(line),
                },
                text: document.text[start..end].to_owned(),
                first_line: line,
            }
        });
        let mut first = values.next().expect("two values or more");
        first.place.document = Some(number);
        let rest: Vec<Document> = values.collect();
        for mut value in rest {
            number += 1;
            value.place.document = Some(number);
            self.queued.push_back(value);
        }
        self.number = number;
        first
    }
}

impl<R: BufRead> Iterator for Documents<R> {
    type Item = Result<Document, Unread>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(document) = self.queued.pop_front() {
            return Some(Ok(document));
        }
        while !self.ended || self.pending.is_some() {
            if let Some(document) = self.next_document() {
                return Some(document.map(|d| self.split(d)));
            }
        }
        if !self.yielded {
            self.yielded = true;
            return Some(Err(Unread {
                place: Place::file(self.file.clone()),
                reason: "empty: no document".into(),
            }));
        }
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Start,
    End,
}

/// `---` or `...` at the start of a line, alone or followed by white space.
fn marker(line: &str) -> Option<Marker> {
    let marker = match line.get(..3)? {
        "---" => Marker::Start,
        "..." => Marker::End,
        _ => return None,
    };
    line[3..]
        .chars()
        .next()
        .is_none_or(char::is_whitespace)
        .then_some(marker)
}

/// A line that is more than white space, a comment or a directive.
fn is_content(line: &str) -> bool {
    let trimmed = line.trim();
    !(trimmed.is_empty() || trimmed.starts_with('#') || line.starts_with('%'))
}

/// `--- {a: 1}`, `--- |`: a document marker with the document's content on its line.
fn has_content_after_marker(line: &str) -> bool {
    is_content(line.get(3..).unwrap_or_default())
}

impl Document {
    /// The document as a JSON value: JSON first (a `kubectl get -o json` List), else YAML.
    /// `Ok(Value::Null)` for a document that is only `null` or `~`.
    pub(crate) fn parse(&self) -> Result<Value, String> {
        if let Some(line) = super::depth::too_deep(&self.text) {
            return Err(format!(
                "nested deeper than {} levels at line {}: not read",
                super::depth::MAX_DEPTH,
                line + self.first_line - 1
            ));
        }
        let mut json_error = None;
        if let Some((skipped, body)) = self.json_body() {
            match serde_json::from_str(body) {
                Ok(value) => return Ok(value),
                Err(e) => {
                    // In a stream of values, the value that is broken says where.
                    let mut stream =
                        serde_json::Deserializer::from_str(body).into_iter::<IgnoredAny>();
                    let first = stream.find_map(Result::err);
                    json_error = Some((skipped, first.unwrap_or(e)));
                }
            }
        }
        serde_yaml_ng::from_str(&self.text).map_err(|e| self.yaml_error(&e, json_error))
    }

    /// The text after its marker line (`---`), and how many lines that is, when it looks like
    /// JSON (it starts with `{` or `[`).
    fn json_body(&self) -> Option<(usize, &str)> {
        let mut body = self.text.as_str();
        let mut skipped = 0;
        if marker(body.lines().next().unwrap_or_default()) == Some(Marker::Start) {
            body = body.split_once('\n').map_or("", |(_, rest)| rest);
            skipped = 1;
        }
        body.trim_start()
            .starts_with(['{', '['])
            .then_some((skipped, body))
    }

    /// Why the text is neither, at the input's line: JSON's error for text that looks like
    /// JSON, else YAML's.
    fn yaml_error(
        &self,
        error: &serde_yaml_ng::Error,
        json: Option<(usize, serde_json::Error)>,
    ) -> String {
        let text = error.to_string();
        // The parser's own position is in this document's text; give the input's line.
        let message = match (json, error.location(), text.rsplit_once(" at line ")) {
            (Some((skipped, json)), ..) => {
                let text = json.to_string();
                let message = text
                    .rsplit_once(" at line ")
                    .map_or(text.as_str(), |(m, _)| m);
                let line = json.line() + skipped + self.first_line - 1;
                format!("{message} at line {line} column {}", json.column())
            }
            (None, Some(at), Some((message, _))) => format!(
                "{message} at line {} column {}",
                at.line() + self.first_line - 1,
                at.column()
            ),
            _ => format!("{text} (in the document from line {})", self.first_line),
        };
        if self.text.contains("{{") {
            return format!(
                "a template ({{{{ … }}}}), not YAML: render it first (helm template) and review the output ({message})"
            );
        }
        format!("input is neither JSON nor YAML: {message}")
    }

    /// The input's line of the value at `path` in this document, when the text can be read up
    /// to it (anchors and merge keys may hide it).
    pub(crate) fn line_of(&self, path: &[Step]) -> Option<usize> {
        line_in(&self.text, path).map(|line| line + self.first_line - 1)
    }
}

pub(crate) use crate::kinds::Step;

/// What the probe's error says when it reached its value: serde_json and serde_yaml_ng mark an
/// error raised by a visitor with where the value it was visiting starts.
const HERE: &str = "tolerable-probe-reached-the-value";

/// The line (in `text`) of the value at `path`.
fn line_in(text: &str, path: &[Step]) -> Option<usize> {
    if text.trim_start().starts_with(['{', '[']) {
        let mut json = serde_json::Deserializer::from_str(text);
        if let Err(e) = Probe(path).deserialize(&mut json) {
            if e.to_string().contains(HERE) {
                return Some(e.line());
            }
        }
    }
    match Probe(path).deserialize(serde_yaml_ng::Deserializer::from_str(text)) {
        Err(e) if e.to_string().contains(HERE) => e.location().map(|at| at.line()),
        _ => None,
    }
}

/// Reads a document down `path` only, passing over everything else, and fails with [`HERE`] on
/// the value at the end of it.
struct Probe<'p>(&'p [Step]);

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        match self.0.first() {
            None => deserializer.deserialize_any(Reached),
            Some(Step::Key(_)) => deserializer.deserialize_map(self),
            Some(Step::Index(_)) => deserializer.deserialize_seq(self),
        }
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the path's next step")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Step::Key(key), rest)) = self.0.split_first() else {
            return Ok(());
        };
        while let Some(name) = map.next_key::<KeyName>()? {
            if name.0.as_deref() == Some(key.as_str()) {
                return map.next_value_seed(Probe(rest));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Step::Index(index), rest)) = self.0.split_first() else {
            return Ok(());
        };
        for _ in 0..*index {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(Probe(rest)).map(drop)
    }
}

/// A mapping key: its text when it is a string.
struct KeyName(Option<String>);

impl<'de> serde::Deserialize<'de> for KeyName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl Visitor<'_> for Name {
            type Value = KeyName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyName, E> {
                Ok(KeyName(Some(v.to_owned())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_unit<E>(self) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
        }
        deserializer.deserialize_any(Name)
    }
}

/// Fails on whatever value it is given, so that the deserializer marks the error with its place.
struct Reached;

impl Reached {
    fn here<E: serde::de::Error>() -> Result<(), E> {
        Err(E::custom(HERE))
    }
}

impl<'de> Visitor<'de> for Reached {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        Self::here()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        Self::here()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        Self::here()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        Self::here()
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        Self::here()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Self::here()
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        Self::here()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Self::here()
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Self::here()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documents(text: &str) -> Vec<Result<Document, Unread>> {
        Documents::new(text.as_bytes(), "f.yaml").collect()
    }

    #[test]
    fn documents_are_cut_at_markers_with_their_number_and_line() {
        let text =
            "# a comment\n---\na: 1\n---\n---\n# nothing\n---\nb: [1,\n  2]\n...\n--- {c: 3}\n";
        let found: Vec<_> = documents(text).into_iter().map(Result::unwrap).collect();
        let places: Vec<_> = found.iter().map(|d| d.place.to_string()).collect();
        // The empty documents 2 and 3 are counted, not listed.
        assert_eq!(
            places,
            [
                "f.yaml:1 (line 3)",
                "f.yaml:4 (line 8)",
                "f.yaml:5 (line 11)"
            ]
        );
        assert_eq!(found[1].parse().unwrap(), serde_json::json!({"b": [1, 2]}));
        assert_eq!(found[2].parse().unwrap(), serde_json::json!({"c": 3}));
    }

    #[test]
    fn a_byte_order_mark_is_read_past_and_an_empty_stream_is_named() {
        let found = documents("\u{feff}kind: Pod\n");
        assert_eq!(
            found[0].as_ref().unwrap().parse().unwrap(),
            serde_json::json!({"kind": "Pod"})
        );
        let empty = documents("# only a comment\n---\n");
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].as_ref().unwrap_err().reason, "empty: no document");
        let binary = Documents::new(&b"kind: Pod\n\xff\xfe\n"[..], "b.yaml").collect::<Vec<_>>();
        assert!(binary[0]
            .as_ref()
            .unwrap_err()
            .reason
            .contains("line 2: not UTF-8"));
    }

    #[test]
    fn errors_and_probes_give_the_inputs_own_lines() {
        let text = "a: 1\n---\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n      - name: a\n        image: nginx\n      - image: 1.0\n---\nkey: [unclosed\n";
        let found = documents(text);
        let deployment = found[1].as_ref().unwrap();
        let path = [
            Step::key("spec"),
            Step::key("template"),
            Step::key("spec"),
            Step::key("containers"),
            Step::Index(1),
            Step::key("image"),
        ];
        assert_eq!(deployment.line_of(&path), Some(10));
        assert_eq!(deployment.line_of(&[Step::key("nope")]), None);
        let bad = found[2].as_ref().unwrap().parse().unwrap_err();
        assert!(bad.starts_with("input is neither JSON nor YAML"), "{bad}");
        assert!(bad.contains("at line 13"), "{bad}");
        let json = Documents::new(
            &b"{\"items\": [\n  {\"kind\": 1},\n  {\"kind\": 2}\n]}"[..],
            "l.json",
        )
        .next()
        .unwrap()
        .unwrap();
        assert_eq!(
            json.line_of(&[Step::key("items"), Step::Index(1), Step::key("kind")]),
            Some(3)
        );
    }

    #[test]
    fn templates_are_named_into_templates() {
        let text =
            "kind: Deployment\nmetadata:\n  name: {{ include \"x\" . }}\n{{- if .Values.on }}\n";
        let reason = documents(text)[0].as_ref().unwrap().parse().unwrap_err();
        assert!(reason.starts_with("a template ({{ … }})"), "{reason}");
    }
    #[test]
    fn json_streams_and_json_lines_are_a_document_per_value_at_its_line() {
        let text = "{\"kind\": \"Pod\", \"n\": 1}\n{\"kind\": \"Pod\", \"n\": 2}\n\n{\n  \"kind\": \"Service\"\n}\n";
        let found: Vec<_> = documents(text).into_iter().map(Result::unwrap).collect();
        let places: Vec<_> = found.iter().map(|d| d.place.to_string()).collect();
        assert_eq!(
            places,
            [
                "f.yaml:1 (line 1)",
                "f.yaml:2 (line 2)",
                "f.yaml:3 (line 4)"
            ]
        );
        assert_eq!(found[1].parse().unwrap()["n"], 2);
        assert_eq!(found[2].parse().unwrap()["kind"], "Service");
        // A stream with a broken value: the values before it are read, and from it on the
        // rest is one document, with JSON's error at the input's line.
        let broken = "---\n{\"kind\": \"Pod\"}\n{\"kind\" \"Pod\"}\n";
        let found = documents(broken);
        assert_eq!(found[0].as_ref().unwrap().parse().unwrap()["kind"], "Pod");
        let err = found[1].as_ref().unwrap().parse().unwrap_err();
        assert!(err.ends_with("expected `:` at line 3 column 9"), "{err}");
        // A YAML flow mapping is no JSON stream.
        let flow = documents("{kind: Pod, b: [1]}\n");
        assert_eq!(flow[0].as_ref().unwrap().parse().unwrap()["b"][0], 1);
    }

    #[test]
    fn an_unreadable_file_is_said_once_and_deep_nesting_is_refused_at_its_line() {
        let binary = Documents::new(&b"\xff\xfe\xfd\n"[..], "b.yaml").collect::<Vec<_>>();
        assert_eq!(binary.len(), 1, "{binary:?}");
        let deep = format!("a: 1\n---\nb:\n  c: {}\n", "[".repeat(400_000));
        let found = documents(&deep);
        let err = found[1].as_ref().unwrap().parse().unwrap_err();
        assert_eq!(err, "nested deeper than 100 levels at line 4: not read");
    }
}
