use super::*;

use std::path::{Path, PathBuf};

/// Whether the scanner takes `text` as one JSON value and nothing else.
fn scanned(text: &str) -> bool {
    let mut scanner = Scanner::new(text);
    scanner.value().is_some() && scanner.end().is_some()
}

/// Whether serde_json takes `text` as one JSON value it skips (what the envelope's read does
/// with the object, and every field it does not know).
fn serde_skips(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Every JSON text in the repository's test data and fuzz corpus, as text.
pub(crate) fn corpus() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    files(&root.join("tests/data"), &mut paths);
    files(&root.join("fuzz/corpus/admission_review"), &mut paths);
    paths
        .iter()
        .filter_map(|p| String::from_utf8(std::fs::read(p).ok()?).ok())
        .collect()
}

/// A fixed sequence of pseudo-random numbers (xorshift): the same mutations on every run.
pub(crate) struct Mutations(u64);

impl Mutations {
    pub(crate) fn new() -> Self {
        Self(0x9e37_79b9_7f4a_7c15)
    }

    fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % below as u64) as usize
    }

    /// `text` with one byte replaced, inserted or removed at a random place: the byte is
    /// one JSON gives meaning to, so most mutations break the text in a way that matters.
    pub(crate) fn mutate(&mut self, text: &str) -> String {
        const BYTES: &[u8] = b"{}[]:,\"\\ \t\n0129-+.eEnultrfasx\x01\x7f";
        let mut bytes = text.as_bytes().to_vec();
        let at = self.next(bytes.len() + 1);
        let byte = BYTES[self.next(BYTES.len())];
        match self.next(3) {
            0 if at < bytes.len() => bytes[at] = byte,
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, byte),
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Texts at the edges of what serde_json takes.
const EDGES: &[&str] = &[
    "0",
    "-0",
    "01",
    "-",
    "1.",
    "1.5",
    ".5",
    "1e5",
    "1E+5",
    "1e",
    "1e+",
    "-1.5e-7",
    "00",
    "nul",
    "null",
    "nulll",
    "true",
    "false",
    "fals",
    "\"\"",
    "\"\\u00e9\"",
    "\"\\u00g9\"",
    "\"\\ud800\"",
    "\"\\x\"",
    "\"\t\"",
    "\"\u{7f}\"",
    "\"é\"",
    "[]",
    "[1,]",
    "[,1]",
    "{}",
    "{,}",
    "{\"a\":1,}",
    "{\"a\" : 1 }",
    "{\"a\"}",
    "{1:2}",
    "[1 2]",
    "{\"a\":1 \"b\":2}",
    " [ ] ",
    "[][]",
    "\"a\"\"b\"",
    "{\"a\":[{\"b\":[]}]}",
    "[\"\\\"\"]",
    "",
];

/// Past a string's first eight bytes, where it is scanned eight at a time: a control
/// character, an escaped quote, an escape, plain bytes and UTF-8, an unterminated string.
const LONG: &[&str] = &[
    "\"abcdefghijk\u{1}lmnop\"",
    "\"abcdefghijklmnopq\\\"rs\"",
    "\"abcdefghijklmnop\\q\"",
    "[\"abcdefghijklmnopqrstuvwxyzé\"]",
    "\"abcdefghijklmnop",
];

/// The one rule the scanner must keep: whatever it accepts, serde_json accepts. Checked on
/// hand-picked edge cases, every file of the test data and fuzz corpus, each of their
/// prefixes (for the small ones), and random one-byte mutations of each.
#[test]
fn what_the_scanner_accepts_serde_json_accepts() {
    for text in LONG {
        assert_eq!(scanned(text), serde_skips(text), "{text:?}");
    }
    for text in EDGES {
        assert!(
            !scanned(text) || serde_skips(text),
            "the scanner took {text:?}"
        );
    }
    let mut mutations = Mutations::new();
    let (mut accepted, mut checked) = (0, 0);
    for text in corpus() {
        let mut inputs = vec![text.clone()];
        if text.len() < 4096 {
            inputs.extend((0..text.len()).filter_map(|n| text.get(..n).map(str::to_owned)));
        }
        inputs.extend((0..200).map(|_| mutations.mutate(&text)));
        for input in &inputs {
            let ok = scanned(input);
            assert!(!ok || serde_skips(input), "the scanner took {input:?}");
            accepted += usize::from(ok);
            checked += 1;
        }
    }
    assert!(
        accepted > 1000 && checked > accepted,
        "{accepted} of {checked}"
    );
}

/// What serde_json takes, the scanner takes too when it is the JSON a real API server sends:
/// otherwise the fast path would not be taken where it is meant for.
#[test]
fn the_scanner_takes_every_valid_file_of_the_test_data() {
    for text in corpus() {
        if serde_skips(&text) && !text.contains("\"a\":{\"a\":{\"a\":{\"a\"") {
            assert!(scanned(&text), "{}", &text[..text.len().min(300)]);
        }
    }
    let nested = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
    let (deep, deeper) = (nested(MAX_DEPTH as usize), nested(MAX_DEPTH as usize + 1));
    assert!(scanned(&deep) && !scanned(&deeper) && serde_skips(&deeper));
}

/// The request's object in an AdmissionReview `body`, as [`review`] scans it.
pub(crate) fn object_of(body: &str) -> Option<Scanned<'_>> {
    let request = member(review(body)?, "request")?;
    member(request, "object")
}

fn member<'a>(value: Scanned<'a>, key: &str) -> Option<Scanned<'a>> {
    let members = value.into_members()?;
    members.into_iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

/// The review is scanned in one pass: checked whole, and looked into where the envelope and a
/// Pod are read — the review's, the request's and the object's members, and those of the
/// object's `metadata` and `spec` — nothing deeper, and nothing of a kind not looked for.
#[test]
fn the_review_is_scanned_where_it_is_read() {
    let body = r#" {"kind":"AdmissionReview","request": {"uid":"u", "object" : {"a":[1, {}]} ,"x":null}} "#;
    let unread = |text| Scanned {
        text,
        inner: Inner::Unread,
    };
    let object = object_of(body).unwrap();
    assert_eq!(object.text, r#"{"a":[1, {}]}"#);
    let members: Vec<_> = object.members().unwrap().collect();
    assert_eq!(members, [("a", &unread("[1, {}]"))]);
    assert_eq!(review(&body.replace("null", "nul")), None);
    assert_eq!(review(&format!("{body}x")), None);
    assert_eq!(
        object_of(r#"{"request":null,"object":{}}"#),
        None,
        "only the request's object"
    );

    let pod = r#"{"request":{"object":{"kind":"Pod","metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c"}],"x":{"y":1}},"metadata":null}}}"#;
    let object = object_of(pod).unwrap();
    let members: Vec<_> = object.members().unwrap().collect();
    let keys: Vec<&str> = members.iter().map(|(key, _)| *key).collect();
    assert_eq!(keys, ["kind", "metadata", "spec", "metadata"]);
    assert_eq!(members[0].1, &unread(r#""Pod""#));
    let metadata: Vec<_> = members[1].1.members().unwrap().collect();
    assert_eq!(metadata, [("labels", &unread(r#"{"a":"b"}"#))]);
    let spec: Vec<_> = members[2].1.members().unwrap().collect();
    assert_eq!(
        spec,
        [
            ("containers", &unread(r#"[{"name":"c"}]"#)),
            ("x", &unread(r#"{"y":1}"#))
        ]
    );
    assert!(members[3].1.is_null() && members[3].1.members().is_none());
    assert_eq!(
        object_of(r#"{"request":{"object":null}}"#),
        Some(unread("null"))
    );
}

/// Fields are read once each, as a derived reader takes them: a field twice, or a key written
/// with escapes, is left to the reader.
#[test]
fn fields_are_read_once_each_and_keys_as_written() {
    fn read(text: &str) -> Option<Vec<(usize, String)>> {
        let object = object_of(text)?;
        let mut got = Vec::new();
        read_fields(object.members()?, &["a", "b"], |field, value| {
            got.push((field, value.text.to_owned()));
            Some(())
        })?;
        Some(got)
    }
    let wrap = |object: &str| format!(r#"{{"request":{{"object":{object}}}}}"#);
    let got = read(&wrap(r#"{"b":1,"c":2,"a":3}"#));
    assert_eq!(got, Some(vec![(1, "1".into()), (0, "3".into())]));
    assert_eq!(read(&wrap(r#"{"a":1,"a":2}"#)), None);
    assert_eq!(read(&wrap(r#"{"\u0061":1}"#)), None);
}

/// An object read member by member stops where asked: what follows is not checked.
#[test]
fn an_object_read_stops_where_asked() {
    let text = r#"{"a":1,"b":{"c":true},"rest": not json"#;
    let mut scanner = Scanner::new(text);
    let mut seen = Vec::new();
    let read = scanner.object(|s, key| {
        seen.push(key);
        if key == "b" {
            return Some(Step::Stop);
        }
        s.value().map(|_| Step::Next)
    });
    assert_eq!((read, seen), (Some(()), vec!["a", "b"]));
}
